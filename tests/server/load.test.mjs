// A bounded load on loopback: 256 streaming requests over 64 concurrent connections, every 8th
// client disconnecting after its first chunk. Zero 5xx, every completed output equal to its
// offline greedy output, and afterwards no request running and every KV slot free or cached.
// Then the lifecycle: a full queue answers 503 with Retry-After, and SIGTERM lets in-flight
// requests finish within the grace period, cancels the rest, and exits 0.
import { test } from "node:test";
import assert from "node:assert/strict";
import { startServer, offline, post, parseMetrics } from "./harness.mjs";

const FLAGS = ["--enable-deterministic-inference", "--max-context-len", "512"];
const WORDS = ["Debian", "The kernel", "A package", "The system", "Linux", "The file", "Install", "The user"];
const PROMPTS = Array.from({ length: 32 }, (_, i) => `${WORDS[i % 8]} ${["is", "has", "can", "will"][i >> 3]}`);

async function streamCompletion(url, prompt, abortEarly, extra = {}) {
  const controller = new AbortController();
  const r = await fetch(url + "/v1/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 32, temperature: 0, stream: true, ...extra }),
    signal: controller.signal,
  });
  if (r.status !== 200) return { status: r.status, text: await r.text() };
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", text = "", finish = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (abortEarly) {
        controller.abort();
        return { status: 200, aborted: true };
      }
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const data = buffer.slice(6, end);
        buffer = buffer.slice(end + 2);
        if (data === "[DONE]") return { status: 200, text, finish };
        const j = JSON.parse(data);
        if (j.error) return { status: 500, text: j.error.message };
        for (const c of j.choices) {
          text += c.text;
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    }
  } catch (e) {
    if (abortEarly) return { status: 200, aborted: true };
    throw e;
  }
  return { status: 200, text, finish, truncated: true };
}

async function waitIdle(url) {
  for (let i = 0; i < 200; i++) {
    const m = parseMetrics(await (await fetch(url + "/metrics")).text());
    if (m.specula_num_requests_running === 0 && m.specula_num_requests_waiting === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("requests still running 10 s after the load");
}

test("256 streaming requests at 64 concurrent connections, some disconnecting early", async () => {
  const reference = await offline(PROMPTS, 32, FLAGS);
  const server = await startServer(FLAGS);
  try {
    const results = new Array(256);
    let next = 0;
    const worker = async () => {
      while (next < 256) {
        const i = next++;
        results[i] = await streamCompletion(server.url, PROMPTS[i % 32], i % 8 === 7);
      }
    };
    await Promise.all(Array.from({ length: 64 }, worker));
    let completed = 0, aborted = 0;
    results.forEach((r, i) => {
      assert.ok(r.status < 500, `request ${i}: ${r.status} ${r.text}`);
      assert.equal(r.status, 200, `request ${i}: ${r.status} ${r.text}`);
      if (r.aborted) return void aborted++;
      completed++;
      assert.ok(!r.truncated, `request ${i}: the stream ended without [DONE]`);
      assert.equal(r.text, reference[i % 32].text, `request ${i}: output differs from generate's`);
      assert.equal(r.finish, reference[i % 32].finish_reason);
    });
    assert.equal(completed, 224);
    assert.equal(aborted, 32);
    const m = await waitIdle(server.url);
    assert.equal(m.specula_kv_cache_free_tokens + m.specula_kv_cache_cached_tokens, m.specula_kv_cache_total_tokens,
                 "every KV slot is free or held by the prefix cache");
    assert.equal(m['specula_requests_total{endpoint="/v1/completions",status="200"}'], 256);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test("a full queue answers 503 with Retry-After and keeps serving", async () => {
  const server = await startServer(["--max-running-requests", "1", "--max-queued-requests", "1"]);
  try {
    const body = { prompt: "Debian is", max_tokens: 64, temperature: 0, ignore_eos: true };
    const replies = await Promise.all(Array.from({ length: 12 }, () => post(server.url, "/v1/completions", body)));
    const busy = replies.filter((r) => r.status === 503);
    assert.ok(busy.length >= 1, `statuses ${replies.map((r) => r.status)}`);
    for (const r of busy) {
      assert.equal(r.headers.get("retry-after"), "1");
      assert.match(r.json.error.message, /queue is full/);
    }
    for (const r of replies) assert.ok(r.status === 200 || r.status === 503);
    assert.equal((await post(server.url, "/v1/completions", body)).status, 200);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

// Resolves once a request is in the engine (running or queued), or once done() says the request
// ended already. A SIGTERM sent after a fixed delay raced a fresh machine's first fetch, which
// then found the server no longer listening.
async function untilInEngine(url, done) {
  while (!done()) {
    const m = parseMetrics(await (await fetch(url + "/metrics")).text());
    if (m.specula_num_requests_running + m.specula_num_requests_waiting >= 1) return;
    await new Promise((r) => setTimeout(r, 2));
  }
}

test("SIGTERM: in-flight requests finish within the grace period; past it they are cancelled; exit 0", async () => {
  let server = await startServer(["--shutdown-grace-s", "30"]);
  let settled = false;
  const short = post(server.url, "/v1/completions", { prompt: "Debian is", max_tokens: 16, temperature: 0 }).finally(
    () => (settled = true),
  );
  await untilInEngine(server.url, () => settled);
  const stopped = server.stop();
  const reply = await short;
  assert.equal(reply.status, 200, reply.text);
  assert.equal(reply.json.choices[0].finish_reason, "length");
  assert.equal((await stopped).code, 0);

  server = await startServer(["--shutdown-grace-s", "0.5", "--max-context-len", "1024"]);
  const started = Date.now();
  let ended = false;
  const long = streamCompletion(server.url, "Debian is", false, { max_tokens: 1000, ignore_eos: true }).finally(
    () => (ended = true),
  );
  await untilInEngine(server.url, () => ended);
  const exit = await server.stop();
  const result = await long;
  assert.equal(exit.code, 0);
  assert.ok(Date.now() - started < 20000, "shutdown took too long");
  // Cancelled after the grace period: the stream ends properly, with finish_reason "abort".
  assert.equal(result.finish, "abort", JSON.stringify(result).slice(0, 300));
});
