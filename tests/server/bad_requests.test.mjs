// Bad requests of many kinds: each gets its status and OpenAI's error JSON naming the problem,
// and the server keeps serving (a good request after each one still works).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer, post } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer(["--max-context-len", "256", "--max-request-bytes", "1048576"]);
});
after(async () => {
  assert.equal((await server.stop()).code, 0);
});

const good = { model: "specula-byte-6m", prompt: "Debian", max_tokens: 2, temperature: 0 };
const chat = (messages, extra = {}) => ({ model: "specula-byte-6m", messages, max_tokens: 2, ...extra });

// [name, path, body (object or raw string), status, message fragment]
const CASES = [
  ["malformed JSON", "/v1/completions", "{\"prompt\": ", 400, "not valid JSON"],
  ["truncated JSON", "/v1/completions", JSON.stringify(good).slice(0, 20), 400, "not valid JSON"],
  ["not an object", "/v1/completions", "[1, 2]", 400, "must be a JSON object"],
  ["empty body", "/v1/completions", "", 400, "not valid JSON"],
  ["prompt missing", "/v1/completions", { max_tokens: 2 }, 400, "'prompt' is missing"],
  ["prompt a number", "/v1/completions", { prompt: 5 }, 400, "'prompt' must be"],
  ["prompt empty string", "/v1/completions", { prompt: "" }, 400, "empty"],
  ["prompt empty array", "/v1/completions", { prompt: [] }, 400, "'prompt' is empty"],
  ["prompt ids negative", "/v1/completions", { prompt: [1, -5] }, 400, "'prompt[1]' = -5 is out of range"],
  ["prompt id beyond the vocabulary", "/v1/completions", { prompt: [1, 100000] }, 400, "100000 is out of range [0, 259)"],
  ["prompt mixed types", "/v1/completions", { prompt: [1, "a"] }, 400, "must be an integer"],
  ["max_tokens negative", "/v1/completions", { ...good, max_tokens: -1 }, 400, "'max_tokens' = -1 is out of range"],
  ["max_tokens a string", "/v1/completions", { ...good, max_tokens: "10" }, 400, "'max_tokens' must be an integer"],
  ["max_tokens huge", "/v1/completions", { ...good, max_tokens: 1e12 }, 400, "max_tokens"],
  ["prompt + max_tokens over the context", "/v1/completions", { ...good, max_tokens: 255 }, 400, "maximum context length is 256 tokens, but 262 tokens were requested (7 in the prompt, 255 for the completion)"],
  ["prompt longer than the context", "/v1/completions", { prompt: "x".repeat(300) }, 400, "maximum context length is 256 tokens; the prompt has 301 tokens"],
  ["temperature negative", "/v1/completions", { ...good, temperature: -0.5 }, 400, "'temperature' = -0.5 is out of range"],
  ["temperature NaN (as a string)", "/v1/completions", { ...good, temperature: "NaN" }, 400, "'temperature' must be a number"],
  ["temperature overflow", "/v1/completions", '{"prompt": "a", "temperature": 1e999}', 400, "number overflow"],
  ["top_p zero", "/v1/completions", { ...good, top_p: 0 }, 400, "'top_p' = 0"],
  ["top_p above 1", "/v1/completions", { ...good, top_p: 1.5 }, 400, "'top_p' = 1.5 is out of range"],
  ["top_k below -1", "/v1/completions", { ...good, top_k: -7 }, 400, "'top_k' = -7 is out of range"],
  ["n zero", "/v1/completions", { ...good, n: 0 }, 400, "'n' = 0 is out of range"],
  ["n huge", "/v1/completions", { ...good, n: 100000 }, 400, "'n' = 100000 is out of range"],
  ["stop not strings", "/v1/completions", { ...good, stop: [1] }, 400, "'stop[0]' must be a string"],
  ["stop empty string", "/v1/completions", { ...good, stop: [""] }, 400, "empty string"],
  ["logprobs too many", "/v1/completions", { ...good, logprobs: 50 }, 400, "'logprobs' = 50 is out of range [0, 20]"],
  ["stream not a bool", "/v1/completions", { ...good, stream: "yes" }, 400, "'stream' must be true or false"],
  ["stream_options without stream", "/v1/completions", { ...good, stream_options: { include_usage: true } }, 400, "only allowed when 'stream' is true"],
  ["seed a float", "/v1/completions", { ...good, seed: 1.5 }, 400, "'seed' must be an integer"],
  ["duplicate keys", "/v1/completions", '{"prompt": "a", "prompt": "b"}', 400, "appears twice"],
  ["regex refused", "/v1/completions", { ...good, regex: "a(?<=b)" }, 400, "regex: position"],
  ["unknown model", "/v1/completions", { ...good, model: "gpt-4o" }, 404, "the model 'gpt-4o' does not exist"],
  ["messages missing", "/v1/chat/completions", { model: "specula-byte-6m" }, 400, "'messages' is missing"],
  ["messages empty", "/v1/chat/completions", chat([]), 400, "'messages' is empty"],
  ["message without role", "/v1/chat/completions", chat([{ content: "hi" }]), 400, "'messages[0].role' is missing"],
  ["message with a bad role", "/v1/chat/completions", chat([{ role: "wizard", content: "hi" }]), 400, "'messages[0].role' = 'wizard' is not valid"],
  ["message content a number", "/v1/chat/completions", chat([{ role: "user", content: 5 }]), 400, "'messages[0].content' must be"],
  ["image content part", "/v1/chat/completions", chat([{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }]), 400, "content part type 'image_url' is not supported"],
  ["top_logprobs without logprobs", "/v1/chat/completions", chat([{ role: "user", content: "hi" }], { top_logprobs: 2 }), 400, "'top_logprobs' needs 'logprobs': true"],
  ["response_format json_schema without a schema", "/v1/chat/completions", chat([{ role: "user", content: "hi" }], { response_format: { type: "json_schema" } }), 400, "'response_format.json_schema' is missing"],
  ["detokenize bad ids", "/detokenize", { tokens: [1, 99999] }, 400, "token id 99999 is out of range"],
  ["tokenize neither prompt nor messages", "/tokenize", {}, 400, "'messages' is missing"],
  ["nesting 100000 levels deep", "/v1/completions", '{"prompt": "a", "temperature": ' + "[".repeat(100000) + "]".repeat(100000) + "}", 400, "deeper than 64 levels"],
  ["a tool call nested deep", "/v1/chat/completions", JSON.stringify(chat([{ role: "assistant", content: "", tool_calls: JSON.parse("[".repeat(80) + "]".repeat(80)) }])), 400, "deeper than 64 levels"],
];

test("each bad request gets its status and error JSON, and the server keeps serving", async () => {
  assert.ok(CASES.length >= 30);
  for (const [name, path, body, status, fragment] of CASES) {
    const r = await post(server.url, path, body);
    assert.equal(r.status, status, `${name}: status ${r.status} (${r.text})`);
    assert.ok(r.json && r.json.error, `${name}: no error JSON: ${r.text}`);
    assert.ok(r.json.error.message.includes(fragment), `${name}: '${r.json.error.message}' lacks '${fragment}'`);
    assert.equal(r.json.error.code, status);
    const ok = await post(server.url, "/v1/completions", good);
    assert.equal(ok.status, 200, `after ${name}: ${ok.text}`);
  }
});

test("invalid UTF-8, a body over the limit, unknown endpoints and wrong methods", async () => {
  const invalid = Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
  let r = await fetch(server.url + "/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" }, body: invalid });
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /not valid JSON/);
  r = await fetch(server.url + "/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: "a".repeat(10 << 20) }) });
  assert.equal(r.status, 413);
  assert.match((await r.json()).error.message, /larger than the limit of 1048576 bytes/);
  // Paths that decode to invalid UTF-8 or a newline are answered (and logged) safely.
  for (const path of ["/%FF%FE", "/v1/%0Acompletions", "/%00"]) {
    r = await fetch(server.url + path);
    assert.equal(r.status, 404, path);
    assert.match((await r.json()).error.message, /no such endpoint/);
  }
  r = await fetch(server.url + "/v1/embeddings", { method: "POST", body: "{}" });
  assert.equal(r.status, 404);
  assert.match((await r.json()).error.message, /no such endpoint/);
  r = await fetch(server.url + "/v1/completions");
  assert.equal(r.status, 405);
  assert.equal(r.headers.get("allow"), "POST");
  r = await fetch(server.url + "/health", { method: "POST" });
  assert.equal(r.status, 405);
  assert.equal((await post(server.url, "/v1/completions", good)).status, 200);
});

test("a client that sends half a request and disconnects does not disturb the server", async () => {
  await new Promise((resolve) => {
    const port = Number(new URL(server.url).port);
    const s = net.connect(port, "127.0.0.1", () => {
      s.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\":");
      setTimeout(() => { s.destroy(); resolve(); }, 50);
    });
  });
  assert.equal((await post(server.url, "/v1/completions", good)).status, 200);
});

test("an API key guards every endpoint but /health", async () => {
  const guarded = await startServer(["--api-key", "sesame"]);
  try {
    assert.equal((await fetch(guarded.url + "/health")).status, 200);
    let r = await post(guarded.url, "/v1/completions", good);
    assert.equal(r.status, 401);
    assert.equal(r.json.error.type, "authentication_error");
    r = await post(guarded.url, "/v1/completions", good, { Authorization: "Bearer wrong" });
    assert.equal(r.status, 401);
    assert.equal((await fetch(guarded.url + "/metrics")).status, 401);
    r = await post(guarded.url, "/v1/completions", good, { Authorization: "Bearer sesame" });
    assert.equal(r.status, 200);
  } finally {
    assert.equal((await guarded.stop()).code, 0);
  }
});
