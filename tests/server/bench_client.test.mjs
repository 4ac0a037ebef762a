// `specula bench serve --url`: the serving benchmark driving a running server over HTTP. The
// report has the offline mode's keys where they apply, counts every token, and fails loudly:
// an unreachable URL, engine flags given to the client, and refused requests all exit 1.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SPECULA, startServer } from "./harness.mjs";

// Runs specula; resolves with { code, stdout, stderr, ms } whatever the exit status.
function specula(args, timeoutMs = 120000) {
  const started = Date.now();
  return new Promise((resolve) => {
    execFile(SPECULA, args, { timeout: timeoutMs, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr, ms: Date.now() - started });
    });
  });
}

const WORKLOAD = ["--num-requests", "16", "--input-len", "32", "--output-len", "16", "--max-concurrency", "4"];

test("--url: 16 requests through the server, reported like the offline benchmark", async () => {
  const dir = mkdtempSync(join(tmpdir(), "specula-bench-client-"));
  const server = await startServer();
  try {
    const remotePath = join(dir, "remote.json"), offlinePath = join(dir, "offline.json");
    const remote = await specula(["bench", "serve", "--url", server.url, ...WORKLOAD, "--json", remotePath]);
    assert.equal(remote.code, 0, remote.stderr + remote.stdout);
    assert.match(remote.stdout, /failed requests\s+0\n/);
    const r = JSON.parse(readFileSync(remotePath, "utf8"));
    assert.equal(r.completed, 16);
    assert.equal(r.failed, 0);
    assert.equal(r.total_input_tokens, 16 * 32);
    assert.equal(r.total_output_tokens, 16 * 16);
    assert.equal(r.max_concurrency, 4);
    for (const key of ["ttft_s", "itl_s", "latency_s"]) {
      for (const stat of ["mean", "median", "p99"]) assert.ok(r[key][stat] > 0, `${key}.${stat} = ${r[key][stat]}`);
    }
    assert.ok(r.latency_s.mean > r.ttft_s.mean);
    assert.ok(r.output_tokens_per_s > 0 && r.request_throughput > 0 && r.duration_s > 0);
    // Engine-side figures from the server's /metrics over the run.
    assert.equal(r.server.generation_tokens, 16 * 16);
    assert.equal(r.server.prompt_tokens, 16 * 32);
    assert.ok(r.server.ttft_mean_s > 0 && r.server.ttft_mean_s <= r.ttft_s.mean);
    assert.equal(r.prefix_cache_hit_rate, 0);

    // The offline mode on the same workload: every key of its report that is not about the local
    // engine is in the remote report too.
    const offline = await specula(["bench", "serve", ...WORKLOAD, "--json", offlinePath]);
    assert.equal(offline.code, 0, offline.stderr);
    const o = JSON.parse(readFileSync(offlinePath, "utf8"));
    assert.equal(o.total_output_tokens, r.total_output_tokens);
    const localOnly = new Set(["device", "prefill_tokens", "retractions", "speculative"]);
    for (const key of Object.keys(o)) {
      if (!localOnly.has(key)) assert.ok(key in r, `offline key '${key}' is missing from the --url report`);
    }
  } finally {
    assert.equal((await server.stop()).code, 0);
    rmSync(dir, { recursive: true, force: true });
  }
});

test("--url to a closed port fails at once with exit 1 and says so", async () => {
  const port = await new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  const r = await specula(["bench", "serve", "--url", url, ...WORKLOAD], 20000);
  assert.equal(r.code, 1, r.stderr);
  assert.ok(r.ms < 5000, `took ${r.ms} ms`);
  assert.match(r.stderr, new RegExp(`cannot reach ${url}: could not connect`));
});

test("--url refuses engine flags, which belong to `specula serve`", async () => {
  const r = await specula(["bench", "serve", "--url", "http://127.0.0.1:9", "--max-running-requests", "8"], 20000);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /--url drives a running server: --max-running-requests configures a local engine/);
});

test("refused requests are counted as failed, reported, and exit 1", async () => {
  const dir = mkdtempSync(join(tmpdir(), "specula-bench-client-"));
  const server = await startServer(["--max-running-requests", "1", "--max-queued-requests", "1"]);
  try {
    const path = join(dir, "busy.json");
    const r = await specula(["bench", "serve", "--url", server.url, "--num-requests", "8", "--input-len", "16",
                             "--output-len", "64", "--json", path]);
    assert.equal(r.code, 1, r.stderr);
    const j = JSON.parse(readFileSync(path, "utf8"));
    assert.ok(j.failed >= 1, JSON.stringify(j));
    assert.equal(j.completed + j.failed, 8);
    assert.equal(j.errors.length, j.failed);
    assert.match(j.errors[0], /HTTP 503: .*queue is full/);
    assert.match(r.stdout, new RegExp(`failed requests\\s+${j.failed}\\n`));
    assert.match(r.stderr, new RegExp(`${j.failed} of 8 requests failed; first: request \\d+: HTTP 503`));
  } finally {
    assert.equal((await server.stop()).code, 0);
    rmSync(dir, { recursive: true, force: true });
  }
});
