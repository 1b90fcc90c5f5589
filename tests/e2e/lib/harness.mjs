// tests/e2e/lib/harness.mjs — starting and stopping `inferd serve`, and the small HTTP helpers the suites share.
//
// The suites run against the server that tests/e2e/run.sh started (INFERD_E2E_URL, INFERD_E2E_PID);
// run alone with `node --test`, each suite starts its own. Servers with other flags (an API key, a
// tiny queue, a small context) are started here from INFERD_BINARY and INFERD_E2E_MODEL; their
// stderr goes to INFERD_E2E_LOG_DIR, which run.sh scans for sanitizer reports.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { after, before } from 'node:test';
import assert from 'node:assert/strict';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

export const binary = path.resolve(repoRoot, process.env.INFERD_BINARY || 'build/inferd');
export const modelDir = path.resolve(repoRoot, process.env.INFERD_E2E_MODEL || 'build/models/e2e-qwen3');
export const modelId = path.basename(modelDir);
export const sanitize = process.env.INFERD_E2E_SANITIZE === '1';
export const logDir = process.env.INFERD_E2E_LOG_DIR || fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-e2e-'));
/* Sanitizer builds start and run several times slower. */
export const slow = sanitize ? 4 : 1;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export { sleep };

/* Every plain fetch gives up after this long, so a hung server fails a test instead of the run. */
const FETCH_MS = 120000 * slow;
const limit = (ms = FETCH_MS) => AbortSignal.timeout(ms);

let serverSeq = 0;

/* Starts `inferd serve MODEL --host 127.0.0.1 --port 0 ...extra` (MODEL: the run's test model
 * unless model names another directory; bin: another inferd binary), waits for its "inferd: serving ID at URL" line and for
 * GET /health == 200. */
export async function startServer(extra = [], { name, model = modelDir, bin = binary } = {}) {
  const tag = name || `server-${process.pid}-${++serverSeq}`;
  const errPath = path.join(logDir, `${tag}.err`);
  const errFile = fs.openSync(errPath, 'w');
  const args = ['serve', model, '--host', '127.0.0.1', '--port', '0', ...extra];
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', errFile] });
  fs.closeSync(errFile);
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  let stdout = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${bin} ${args.join(' ')}: no "inferd: serving" line on stdout within ${60 * slow} s (stdout so far: ${JSON.stringify(stdout)})`)),
      60000 * slow,
    );
    proc.stdout.on('data', (d) => {
      stdout += d.toString();
      const m = /inferd: serving (\S+) at (http:\/\/\S+)/.exec(stdout);
      if (m) {
        clearTimeout(timer);
        resolve(m[2].replace(/\/$/, ''));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`${bin} ${args.join(' ')} exited (code ${code}, signal ${signal}) before serving; stderr in ${errPath}:\n${readTail(errPath)}`));
    });
  });
  proc.stdout.resume();
  await waitHealthy(url, 60000 * slow);
  return {
    url,
    pid: proc.pid,
    proc,
    errPath,
    stdout: () => stdout,
    /* SIGTERM; resolves to {code, signal, ms}; the caller checks code 0 within 10 s. */
    async stop(graceMs = 10000) {
      const t0 = Date.now();
      if (proc.exitCode !== null || proc.signalCode !== null) {
        const r = await exited;
        return { ...r, ms: 0 };
      }
      proc.kill('SIGTERM');
      // the grace timer is cleared once the server exits: a pending one would keep the test
      // process alive for the rest of graceMs after the suite ends
      let grace;
      const r = await Promise.race([exited, new Promise((res) => { grace = setTimeout(() => res(null), graceMs); })]);
      clearTimeout(grace);
      if (!r) {
        proc.kill('SIGKILL');
        await exited;
        return { code: null, signal: 'SIGKILL', ms: Date.now() - t0, hung: true };
      }
      return { ...r, ms: Date.now() - t0 };
    },
  };
}

export function readTail(file, n = 4000) {
  try {
    const s = fs.readFileSync(file, 'utf8');
    return s.length > n ? s.slice(-n) : s;
  } catch {
    return '';
  }
}

export async function waitHealthy(url, ms) {
  const deadline = Date.now() + ms;
  let last = '';
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`${url}/health`, { signal: limit(5000 * slow) });
      last = `${r.status} ${await r.text()}`;
      if (r.status === 200) return;
    } catch (e) {
      last = String(e.cause || e);
    }
    await sleep(100);
  }
  throw new Error(`GET ${url}/health never answered 200 (last: ${last})`);
}

/* The run's shared server: run.sh's, or one started for this suite (stopped by the returned stop()). */
export async function mainServer() {
  if (process.env.INFERD_E2E_URL) {
    return { url: process.env.INFERD_E2E_URL.replace(/\/$/, ''), pid: Number(process.env.INFERD_E2E_PID) || 0, stop: async () => null, own: false };
  }
  const s = await startServer([], { name: `suite-${path.basename(process.argv[1] || 'x')}-${process.pid}` });
  return { ...s, own: true };
}

/* Hooks for a suite run against the main server: before it, start (or reuse) the server and
 * hand it and an SDK client to use(server, client); after it, stop the server when this suite
 * started it and require exit status 0. */
export function useMainServer(use) {
  let server;
  before(async () => {
    server = await mainServer();
    use(server, client(server.url));
  });
  after(async () => {
    if (server?.own) {
      const r = await server.stop();
      assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}`);
    }
  });
}

export function client(url, opts = {}) {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: opts.apiKey ?? 'unused', maxRetries: 0, timeout: opts.timeout ?? 120000 * slow });
}

export const hello = [{ role: 'user', content: 'Say hello.' }];

/* A normal small chat request through plain fetch; throws with the status and body when it fails. */
export async function smallChat(url, headers = {}) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: modelId, messages: hello, max_tokens: 2 }),
    signal: limit(),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`small chat request: HTTP ${r.status} ${text}`);
  const body = JSON.parse(text);
  if (body.object !== 'chat.completion' || !body.choices?.[0]?.message) throw new Error(`small chat request: unexpected body ${text}`);
  return body;
}

/* GET /health answers 200 {"status":"ok"} and a small chat succeeds; throws otherwise. */
export async function assertServing(url) {
  const r = await fetch(`${url}/health`, { signal: limit(30000 * slow) });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`GET /health: HTTP ${r.status} ${text}`);
  await smallChat(url);
}

/* Parses a text/event-stream body into its data payloads ("[DONE]" kept as a string). */
export function sseEvents(text) {
  const out = [];
  for (const block of text.split(/\r?\n\r?\n/)) {
    const data = block
      .split(/\r?\n/)
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, ''))
      .join('\n');
    if (data) out.push(data);
  }
  return out;
}

/* POST JSON through fetch and read an SSE stream whole: {status, headers, raw, events, chunks, done}. */
export async function sseRequest(url, route, body, headers = {}) {
  const r = await fetch(`${url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: limit(),
  });
  const raw = await r.text();
  const events = r.status === 200 ? sseEvents(raw) : [];
  const chunks = events.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e));
  return { status: r.status, headers: r.headers, raw, events, chunks, done: events.at(-1) === '[DONE]' };
}

/* Prometheus text → Map of "name{labels}" → number (labels as written by the server). */
export function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    const key = line.slice(0, i).trim();
    m.set(key, Number(line.slice(i + 1)));
  }
  return m;
}

export async function metrics(url) {
  const r = await fetch(`${url}/metrics`, { signal: limit(30000 * slow) });
  if (r.status !== 200) throw new Error(`GET /metrics: HTTP ${r.status}`);
  return parseMetrics(await r.text());
}

/* Sum of every series of a metric name (any labels). */
export function metricSum(m, name) {
  let s = 0;
  let seen = false;
  for (const [k, v] of m) {
    if (k === name || k.startsWith(`${name}{`)) {
      s += v;
      seen = true;
    }
  }
  return seen ? s : NaN;
}

/* The server's resident set size in KiB, from /proc (0 when the pid is unknown). */
export function rssKiB(pid) {
  if (!pid) return 0;
  try {
    const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}
