// `specula serve` through the official OpenAI SDK for Node: completions and chat, whole and
// streamed, n > 1, stop strings, logprobs, include_usage, and greedy outputs equal to
// `specula generate`'s for the same prompts (also with EAGLE-3 speculation).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, offline, post } from "./harness.mjs";

const PROMPTS = ["The quick brown fox", "Debian is", "To install a package, run"];
let server, client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused" });
});
after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, "the server exits 0 on SIGTERM");
});

test("greedy completions equal specula generate, whole and streamed", async () => {
  const reference = await offline(PROMPTS, 24);
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await client.completions.create({ model: "specula-byte-6m", prompt: PROMPTS[i], max_tokens: 24, temperature: 0 });
    assert.equal(r.object, "text_completion");
    assert.equal(r.choices[0].text, reference[i].text);
    assert.equal(r.choices[0].finish_reason, reference[i].finish_reason);
    assert.equal(r.usage.completion_tokens, reference[i].output_ids.length);
    assert.equal(r.usage.prompt_tokens, reference[i].prompt_ids.length);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    const stream = await client.completions.create({
      model: "specula-byte-6m", prompt: PROMPTS[i], max_tokens: 24, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "", usage = null, finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, reference[i].text);
    assert.equal(finish, reference[i].finish_reason);
    assert.equal(usage.completion_tokens, reference[i].output_ids.length);
  }
});

test("a batch of prompts (strings and token ids) in one request, with echo", async () => {
  const reference = await offline(PROMPTS, 12);
  const r = await client.completions.create({ model: "specula-byte-6m", prompt: PROMPTS, max_tokens: 12, temperature: 0, echo: true });
  assert.equal(r.choices.length, PROMPTS.length);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.text, PROMPTS[i] + reference[i].text);
  });
  const ids = reference.map((x) => x.prompt_ids);
  const byIds = await client.completions.create({ model: "specula-byte-6m", prompt: ids, max_tokens: 12, temperature: 0 });
  byIds.choices.forEach((c, i) => assert.equal(c.text, reference[i].text));
});

test("chat completions render the template and equal generate on the rendered prompt", async () => {
  const messages = [
    { role: "system", content: "You answer in one line." },
    { role: "user", content: [{ type: "text", text: "What is Debian?" }] },
  ];
  const tok = await post(server.url, "/tokenize", { messages });
  assert.equal(tok.status, 200);
  const [reference] = await offline([tok.json.tokens], 20);
  const r = await client.chat.completions.create({ model: "specula-byte-6m", messages, max_tokens: 20, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].message.content, reference.text);
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  const stream = await client.chat.completions.create({
    model: "specula-byte-6m", messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", role = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, reference.text);
  assert.equal(usage.completion_tokens, reference.output_ids.length);
  assert.ok(chunks >= 3, `a stream of ${chunks} chunks`);
});

test("n > 1 with a seed: reproducible, distinct choices", async () => {
  const ask = () => client.completions.create({ model: "specula-byte-6m", prompt: "Debian is", max_tokens: 16, temperature: 1.0, n: 4, seed: 7 });
  const [a, b] = [await ask(), await ask()];
  assert.equal(a.choices.length, 4);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  assert.ok(new Set(a.choices.map((c) => c.text)).size > 1, "four samples are not all the same");
  // The prompt counts once ("<s>Debian is": 10 tokens), the four outputs together.
  assert.equal(a.usage.prompt_tokens, 10);
  assert.ok(a.usage.completion_tokens >= 4 && a.usage.completion_tokens <= 64);
});

test("stop strings end the text before the stop string", async () => {
  const [reference] = await offline(["The quick brown fox"], 40);
  const text = reference.text;
  const stop = text.slice(5, 7);
  const r = await client.completions.create({ model: "specula-byte-6m", prompt: "The quick brown fox", max_tokens: 40, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.choices[0].text, text.slice(0, text.indexOf(stop)));
});

test("logprobs: completions' top-N and chat's top_logprobs, consistent with greedy", async () => {
  const r = await client.completions.create({ model: "specula-byte-6m", prompt: "Debian is", max_tokens: 8, temperature: 0, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.tokens.join(""), r.choices[0].text);
  for (let i = 0; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0 && lp.token_logprobs[i] > -50);
    const top = Object.entries(lp.top_logprobs[i]);
    assert.equal(top.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.equal(top[0][0], lp.tokens[i]);
    assert.ok(Math.abs(top[0][1] - lp.token_logprobs[i]) < 1e-6);
    assert.ok(top[0][1] >= top[1][1] && top[1][1] >= top[2][1]);
    assert.equal(lp.text_offset[i], lp.tokens.slice(0, i).join("").length);
  }
  const c = await client.chat.completions.create({
    model: "specula-byte-6m", messages: [{ role: "user", content: "Hello" }], max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, c.usage.completion_tokens);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 2);
    assert.equal(t.top_logprobs[0].token, t.token);
    // Byte-level vocabulary: one byte a token; ASCII bytes are their own text.
    assert.equal(t.bytes.length, 1);
    if (t.bytes[0] < 128) assert.equal(t.token, String.fromCharCode(t.bytes[0]));
    const p = t.top_logprobs.reduce((s, x) => s + Math.exp(x.logprob), 0);
    assert.ok(p <= 1 + 1e-5);
  }
});

test("models, health, tokenize, detokenize and metrics", async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, "specula-byte-6m");
  assert.equal((await fetch(server.url + "/health")).status, 200);
  const tok = await post(server.url, "/tokenize", { prompt: "héllo" });
  assert.deepEqual(tok.json.tokens, [256, 104, 195, 169, 108, 108, 111]);
  const detok = await post(server.url, "/detokenize", { tokens: tok.json.tokens.slice(1) });
  assert.equal(detok.json.prompt, "héllo");
  const metrics = await (await fetch(server.url + "/metrics")).text();
  assert.match(metrics, /^specula_requests_total\{endpoint="\/v1\/completions",status="200"\} \d+$/m);
  assert.match(metrics, /^specula_time_to_first_token_seconds_count \d+$/m);
  assert.match(metrics, /^specula_num_requests_running 0$/m);
});

test("with EAGLE-3 speculative decoding the greedy outputs are still generate's", async () => {
  const spec = await startServer(["--speculative-algorithm", "EAGLE3"]);
  try {
    const reference = await offline(PROMPTS, 40);
    const specClient = new OpenAI({ baseURL: spec.url + "/v1", apiKey: "unused" });
    for (let i = 0; i < PROMPTS.length; i++) {
      const r = await specClient.completions.create({ model: "specula-byte-6m", prompt: PROMPTS[i], max_tokens: 40, temperature: 0 });
      assert.equal(r.choices[0].text, reference[i].text);
      let streamed = "";
      const stream = await specClient.completions.create({ model: "specula-byte-6m", prompt: PROMPTS[i], max_tokens: 40, temperature: 0, stream: true });
      for await (const chunk of stream) for (const c of chunk.choices) streamed += c.text;
      assert.equal(streamed, reference[i].text);
    }
    const m = await (await fetch(spec.url + "/metrics")).text();
    const accept = Number(m.match(/^specula_spec_accept_length (\S+)$/m)[1]);
    assert.ok(accept > 1, `mean accept length ${accept}`);
    // Logprobs under speculation are the target's, as plain decoding reports them.
    const body = { model: "specula-byte-6m", prompt: PROMPTS[0], max_tokens: 24, temperature: 0, logprobs: 2 };
    const plainLp = await post(server.url, "/v1/completions", body);
    const specLp = await post(spec.url, "/v1/completions", body);
    assert.equal(plainLp.status, 200);
    assert.equal(specLp.status, 200);
    const a = plainLp.json.choices[0].logprobs, b = specLp.json.choices[0].logprobs;
    assert.deepEqual(b.tokens, a.tokens);
    assert.equal(b.token_logprobs.length, 24);
    for (let t = 0; t < a.token_logprobs.length; t++) {
      assert.ok(Math.abs(a.token_logprobs[t] - b.token_logprobs[t]) < 1e-3, `token ${t}: ${a.token_logprobs[t]} vs ${b.token_logprobs[t]}`);
    }
  } finally {
    assert.equal((await spec.stop()).code, 0);
  }
});
