// Starts `specula serve` on 127.0.0.1 with an ephemeral port and runs `specula generate` for
// offline references. SPECULA is the binary (ctest passes it).
import { spawn, execFile } from "node:child_process";
import { promisify } from "node:util";

export const SPECULA = process.env.SPECULA;
if (!SPECULA) throw new Error("set SPECULA to the specula binary");

// Starts a server with extra flags; resolves once it listens. stop() sends SIGTERM and resolves
// with the exit code.
export function startServer(flags = [], { timeoutMs = 60000 } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(SPECULA, ["serve", "--port", "0", "--log-level", "warning", ...flags], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`server did not start within ${timeoutMs} ms: ${stderr}`));
    }, timeoutMs);
    proc.stderr.on("data", (d) => {
      stderr += d.toString();
      const m = stderr.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && timer) {
        clearTimeout(timer);
        const url = `http://127.0.0.1:${m[1]}`;
        const exited = new Promise((r) => proc.on("exit", (code, signal) => r({ code, signal })));
        resolve({
          url,
          proc,
          stderr: () => stderr,
          exited,
          stop: async (signal = "SIGTERM") => {
            proc.kill(signal);
            return exited;
          },
        });
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening: ${stderr}`));
    });
  });
}

// `specula generate --json` for each prompt (text or ids), greedy; one result per prompt.
// Asynchronous on purpose: a synchronous child blocks the event loop, so a keep-alive socket the
// server closed meanwhile (after its 5 s idle timeout) stays in fetch's pool unnoticed and the
// next request on it fails with "fetch failed".
export async function offline(prompts, maxNewTokens, extra = []) {
  const args = ["generate", "--json", "--max-new-tokens", String(maxNewTokens), ...extra];
  for (const p of prompts) {
    if (Array.isArray(p)) args.push("--prompt-ids", p.join(","));
    else args.push("--prompt", p);
  }
  const { stdout: out } = await promisify(execFile)(SPECULA, args, { encoding: "utf8", maxBuffer: 64 << 20 });
  return out.trim().split("\n").map((l) => JSON.parse(l)).filter((j) => j.output_ids);
}

export async function post(url, path, body, headers = {}) {
  const r = await fetch(url + path, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: r.status, json, text, headers: r.headers };
}

// Prometheus text -> {name{labels}: value}.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}
