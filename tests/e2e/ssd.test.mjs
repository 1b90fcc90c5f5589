// tests/e2e/ssd.test.mjs — the SSD tier (--ssd-cache) through a real server: restart survival, damaged files, a full disk, fingerprints, the flush route, load, kill -9.
//
// Every test starts its own servers (harness startServer) over a fresh cache directory, in exact
// mode, where restored K/V is bit-identical to what was written and so every answer must equal a
// cold run's. The crash loop is bench/ssd_kill.sh, shortened (INFERD_E2E_SSD_KILLS iterations).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { binary, client, logDir, metrics, modelDir, modelId, readTail, sanitize, slow, startServer } from './lib/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const KILLS = Number(process.env.INFERD_E2E_SSD_KILLS || (sanitize ? 2 : 5));
const greedy = { model: modelId, temperature: 0 };
/* Long enough for a dozen full blocks of 16: most of the prompt can come back from disk. */
const story = 'The lighthouse keeper counted the ships that passed the headland every night, wrote their names in a ledger, '
  + 'and listened to the wind in the rigging of the old boats moored below the cliffs. ';
const convo = (q) => [{ role: 'system', content: story.repeat(3) }, { role: 'user', content: q }];

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-ssd-e2e-'));
const fresh = (name) => {
  const d = path.join(work, name);
  fs.mkdirSync(d, { recursive: true });
  return d;
};
after(() => fs.rmSync(work, { recursive: true, force: true }));

async function ask(url, q, extra = {}) {
  const r = await client(url).chat.completions.create({ ...greedy, messages: convo(q), max_tokens: 12, ...extra });
  return { text: r.choices[0].message.content, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0, prompt: r.usage.prompt_tokens };
}

async function flush(url, { body, headers = {} } = {}) {
  const r = await fetch(`${url}/admin/cache/flush`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: body === undefined ? undefined : body,
  });
  return { status: r.status, body: await r.json() };
}

const stats = async (url) => (await (await fetch(`${url}/stats`)).json()).ssd_cache;

/* Every regular file under dir. */
function filesUnder(dir) {
  return fs.readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile()).map((e) => path.join(e.parentPath ?? e.path, e.name));
}

/* Starts an exact-mode server over dir, stopping it (exit 0 required) after use(server). */
async function withServer(dir, extra, name, use) {
  const s = await startServer(['--mode', 'exact', '--ssd-cache', dir, ...extra], { name });
  try {
    return await use(s);
  } finally {
    const r = await s.stop(30000 * slow);
    assert.equal(r.code, 0, `${name}: exit ${JSON.stringify(r)}; stderr: ${readTail(s.errPath, 1500)}`);
  }
}

const questions = ['Which ship came first?', 'What did the ledger say?'];
/* Cold answers (nothing cached anywhere), the reference every restore is held to. */
const cold = [];
/* A cache directory left by a clean run: both questions asked, flushed, SIGTERM; the
 * fingerprint directory it made, and that server's log. */
let filled;
let filledFp;
let filledLog;

describe('SSD tier', () => {
  before(async () => {
    filled = fresh('filled');
    await withServer(filled, [], 'ssd-fill', async (s) => {
      for (const q of questions) cold.push(await ask(s.url, q));
      const f = await flush(s.url);
      assert.equal(f.status, 200, JSON.stringify(f.body));
      filledFp = path.basename((await stats(s.url)).dir);
      filledLog = s.errPath;
    });
  });

  test('restart survival: chat, flush (durable), SIGTERM (exit 0), restart: the same conversation reuses the disk and answers the same', async (t) => {
    const dir = fresh('restart');
    let first;
    const s1 = await startServer(['--mode', 'exact', '--ssd-cache', dir], { name: 'ssd-restart-1' });
    try {
      first = await ask(s1.url, questions[0]);
      assert.equal(first.text, cold[0].text, 'a fresh directory answers as a cold run');
      const f = await flush(s1.url);
      t.diagnostic(`flush: ${JSON.stringify(f.body)}`);
      assert.equal(f.status, 200);
      assert.equal(f.body.durable, true);
      assert.equal(f.body.pending, 0);
      assert.ok(f.body.blocks >= Math.floor(first.prompt / 16) && f.body.writes === f.body.blocks, JSON.stringify(f.body));
      for (const k of ['pending_bytes', 'bytes', 'write_bytes', 'failed', 'dropped']) assert.equal(typeof f.body[k], 'number', k);
      assert.equal(f.body.disabled, false);
    } finally {
      const r = await s1.stop(30000 * slow);
      assert.equal(r.code, 0, `exit after SIGTERM: ${JSON.stringify(r)}`);
    }
    assert.match(readTail(s1.errPath), /SSD tier at exit: flushed; \d+ blocks/);
    await withServer(dir, [], 'ssd-restart-2', async (s2) => {
      const st0 = await stats(s2.url);
      assert.ok(st0.blocks >= Math.floor(first.prompt / 16), `blocks on disk at start: ${st0.blocks}`);
      const again = await ask(s2.url, questions[0]);
      t.diagnostic(`after restart: cached_tokens ${again.cached} of ${again.prompt}`);
      assert.ok(again.cached > 0, 'cached_tokens > 0 after a restart');
      assert.equal(again.text, first.text, 'the same greedy answer');
      const st = await stats(s2.url);
      assert.ok(st.restores >= 1 && st.decisions_restore >= 1, JSON.stringify(st));
      assert.equal(st.verify_failures, 0);
      assert.ok(st.predicted_restore_ms >= 0 && st.predicted_recompute_ms > 0, JSON.stringify(st));
    });
  });

  test('/stats.ssd_cache and /metrics inferd_ssd_cache_*: every number, typed counter or gauge', async () => {
    await withServer(filled, [], 'ssd-stats', async (s) => {
      const st = await stats(s.url);
      for (const k of ['blocks', 'bytes', 'max_bytes', 'writes', 'write_bytes', 'restores', 'restore_bytes', 'restore_ms_last', 'pending', 'dropped',
        'failed', 'verify_failures', 'recomputes', 'decisions_restore', 'decisions_recompute', 'predicted_restore_ms', 'predicted_recompute_ms',
        'read_bytes_per_s', 'prefill_tokens_per_s', 'recovered_blocks', 'dropped_at_start', 'demoted'])
        assert.equal(typeof st[k], 'number', `ssd_cache.${k}`);
      assert.equal(typeof st.dir, 'string');
      assert.ok(st.dir.startsWith(filled), st.dir);
      assert.equal(st.disabled, false);
      assert.equal(st.disable_reason, null);
      assert.ok(st.prefill_tokens_per_s > 0, 'the prefill rate was measured');
      const text = await (await fetch(`${s.url}/metrics`)).text();
      for (const [name, type] of [['inferd_ssd_cache_blocks', 'gauge'], ['inferd_ssd_cache_writes_total', 'counter'], ['inferd_ssd_cache_restores_total', 'counter'],
        ['inferd_ssd_cache_pending', 'gauge'], ['inferd_ssd_cache_verify_failures_total', 'counter'], ['inferd_ssd_cache_decisions_restore_total', 'counter'],
        ['inferd_ssd_cache_read_bytes_per_s', 'gauge'], ['inferd_ssd_cache_disabled', 'gauge']])
        assert.match(text, new RegExp(`^# TYPE ${name} ${type}$`, 'm'), name);
      const m = await metrics(s.url);
      assert.equal(m.get('inferd_ssd_cache_blocks'), st.blocks);
    });
  });

  test('flush: 400 without --ssd-cache, 400 for a bad body, 401 with a wrong key; /stats.ssd_cache is null without a tier', async () => {
    const plain = await startServer([], { name: 'ssd-none' });
    try {
      const r = await flush(plain.url);
      assert.equal(r.status, 400);
      assert.match(r.body.error.message, /--ssd-cache/);
      const st = await (await fetch(`${plain.url}/stats`)).json();
      assert.equal(st.ssd_cache, null);
      const m = await metrics(plain.url);
      assert.ok(![...m.keys()].some((k) => k.startsWith('inferd_ssd_cache_')), 'no inferd_ssd_cache_* without a tier');
    } finally {
      assert.equal((await plain.stop()).code, 0);
    }
    await withServer(fresh('keyed'), ['--api-key', 'sk-ssd'], 'ssd-key', async (s) => {
      assert.equal((await flush(s.url)).status, 401);
      assert.equal((await flush(s.url, { headers: { authorization: 'Bearer sk-wrong' } })).status, 401);
      const auth = { authorization: 'Bearer sk-ssd' };
      for (const bad of ['{"timeout_ms": "x"}', '{"timeout_ms', '[]', '{"timeout_ms": -1}', '{"other": 1}']) {
        const r = await flush(s.url, { body: bad, headers: auth });
        assert.equal(r.status, 400, bad);
        assert.equal(typeof r.body.error?.message, 'string');
      }
      const ok = await flush(s.url, { body: '{"timeout_ms": 5000}', headers: auth });
      assert.equal(ok.status, 200);
      assert.equal(ok.body.durable, true);
    });
  });

  test('corruption: bytes flipped in the middle of every file (index included): the server starts, answers as a cold run, counts what it dropped', async (t) => {
    const dir = fresh('flipped');
    fs.cpSync(filled, dir, { recursive: true });
    const files = filesUnder(dir).filter((f) => fs.statSync(f).size > 0);
    assert.ok(files.some((f) => /seg-.*\.dat$/.test(f)) && files.some((f) => /index\.sqlite$/.test(f)), files.join(' '));
    for (const f of files) {
      const b = fs.readFileSync(f);
      const mid = Math.floor(b.length / 2);
      for (let i = Math.max(0, mid - 32); i < Math.min(b.length, mid + 32); i++) b[i] ^= 0xa5;
      fs.writeFileSync(f, b);
    }
    await withServer(dir, [], 'ssd-flipped', async (s) => {
      for (let i = 0; i < questions.length; i++) assert.equal((await ask(s.url, questions[i])).text, cold[i].text, `question ${i}`);
      const st = await stats(s.url);
      t.diagnostic(`after the flips: ${JSON.stringify(st)}`);
      assert.ok(st.verify_failures + st.dropped_at_start + st.recomputes + (st.index_rebuilt ? 1 : 0) > 0, 'what was dropped is counted');
    });
  });

  test('corruption: a truncated segment: the server starts, answers as a cold run, counts what it dropped', async (t) => {
    const dir = fresh('truncated');
    fs.cpSync(filled, dir, { recursive: true });
    const segs = filesUnder(dir).filter((f) => /seg-.*\.dat$/.test(f));
    assert.ok(segs.length > 0);
    for (const f of segs) fs.truncateSync(f, Math.floor(fs.statSync(f).size / 2) + 100);
    await withServer(dir, [], 'ssd-truncated', async (s) => {
      for (let i = 0; i < questions.length; i++) assert.equal((await ask(s.url, questions[i])).text, cold[i].text, `question ${i}`);
      const st = await stats(s.url);
      t.diagnostic(`after the truncation: ${JSON.stringify(st)}`);
      assert.ok(st.dropped_at_start + st.verify_failures + st.torn_tails > 0, 'what was dropped is counted');
    });
  });

  test('a damaged index never refuses start-up: rebuilt from the segments, the blocks still restore', async () => {
    const dir = fresh('garbage-index');
    fs.cpSync(filled, dir, { recursive: true });
    const index = filesUnder(dir).find((f) => f.endsWith('index.sqlite'));
    fs.writeFileSync(index, Buffer.alloc(fs.statSync(index).size || 8192, 0x5a));
    await withServer(dir, [], 'ssd-garbage-index', async (s) => {
      const st = await stats(s.url);
      assert.equal(st.index_rebuilt, true, JSON.stringify(st));
      const a = await ask(s.url, questions[1]);
      assert.equal(a.text, cold[1].text);
      assert.ok(a.cached > 0, 'the rebuilt index finds the blocks');
    });
  });

  test('fingerprints: another model (mkmodel --seed) or another CPU instruction set reuses nothing of the same directory and leaves it be', async (t) => {
    const dir = fresh('fingerprint');
    fs.cpSync(filled, dir, { recursive: true });
    const before = filesUnder(dir).map((f) => [f, fs.statSync(f).size]).filter(([f]) => /seg-.*\.dat$/.test(f));
    const other = path.join(work, 'other-model');
    execFileSync(binary, ['mkmodel', '--preset', 'tiny-qwen3', '--seed', '7', '--tokenizer', modelDir, '--out', other], { stdio: 'ignore' });
    const o = await startServer(['--mode', 'exact', '--ssd-cache', dir], { name: 'ssd-other-model', model: other });
    try {
      const a = await ask(o.url, questions[0]);
      assert.equal(a.cached, 0, 'another model reuses none of the stored blocks');
      assert.notEqual(path.basename((await stats(o.url)).dir), filledFp, 'another fingerprint directory');
    } finally {
      assert.equal((await o.stop()).code, 0);
    }
    const identity = /\(cpu-(\w+)-exact\)/.exec(readTail(filledLog))?.[1];
    if (identity && identity !== 'avx2') {
      await withServer(dir, ['--cpu-isa', 'avx2'], 'ssd-avx2', async (a2) => {
        const a = await ask(a2.url, questions[0]);
        assert.equal(a.cached, 0, `K/V computed with ${identity} kernels is not reused by avx2 ones`);
      });
    } else {
      t.diagnostic(`the default kernels are ${identity}: no lower instruction set to compare with`);
    }
    for (const [f, size] of before) assert.equal(fs.statSync(f).size, size, `${f} untouched`);
  });

  test('an uncreatable --ssd-cache DIR is a start-up error; so is --ssd-cache with --prompt-cache 0', async () => {
    const file = path.join(work, 'a-file');
    fs.writeFileSync(file, 'not a directory');
    await assert.rejects(startServer(['--ssd-cache', path.join(file, 'cache')], { name: 'ssd-uncreatable' }), /exited \(code [1-9][\s\S]*cannot be created or written/);
    await assert.rejects(startServer(['--ssd-cache', fresh('no-ram'), '--prompt-cache', '0'], { name: 'ssd-no-ram' }), /exited \(code 2[\s\S]*needs the prompt cache/);
    await assert.rejects(startServer(['--ssd-cache-max', '1'], { name: 'ssd-max-alone' }), /exited \(code 2[\s\S]*need --ssd-cache DIR/);
    await assert.rejects(startServer(['--ssd-cache', fresh('bad-max'), '--ssd-cache-max', 'lots'], { name: 'ssd-bad-max' }), /exited \(code 2/);
  });

  test('disk full while serving (a 1 MiB tmpfs): the tier turns itself off with a reason and a log line, serving goes on', async (t) => {
    const dir = fresh('tmpfs');
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', dir], { stdio: 'pipe' });
    } catch (e) {
      t.skip(`cannot mount a tmpfs here (${String(e.stderr || e.message).trim().split('\n')[0]}): the disk-full path is covered by test_ssd_store only`);
      return;
    }
    try {
      await withServer(dir, [], 'ssd-full', async (s) => {
        // Whatever the store left free is filled, so the next segment write finds no room.
        const filler = fs.openSync(path.join(dir, 'filler'), 'w');
        try {
          const chunk = Buffer.alloc(16384, 1);
          for (;;) fs.writeSync(filler, chunk);
        } catch (e) {
          assert.equal(e.code, 'ENOSPC');
        } finally {
          fs.closeSync(filler);
        }
        for (let i = 0; i < 4; i++) await ask(s.url, `Question ${i} about the weather at sea, asked on a full disk.`);
        const f = await flush(s.url, { body: '{"timeout_ms": 10000}' });
        t.diagnostic(`flush on a full disk: ${f.status} ${JSON.stringify(f.body)}`);
        assert.equal(f.status, 503);
        assert.equal(f.body.durable, false);
        const st = await stats(s.url);
        assert.equal(st.disabled, true, JSON.stringify(st));
        assert.equal(typeof st.disable_reason, 'string');
        assert.match(readTail(s.errPath), /the SSD tier is off, serving continues/);
        for (let i = 0; i < questions.length; i++) assert.equal((await ask(s.url, questions[i])).text, cold[i].text, 'serving goes on, answers unchanged');
      });
    } finally {
      execFileSync('umount', [dir]);
    }
  });

  test('the load suite against a server with --ssd-cache: concurrent readers and writers, no errors', { timeout: 300000 * slow }, async (t) => {
    await withServer(fresh('load'), [], 'ssd-load', async (s) => {
      const env = { ...process.env, INFERD_E2E_URL: s.url, INFERD_E2E_PID: String(s.pid), INFERD_E2E_LOAD_SECONDS: process.env.INFERD_E2E_SSD_LOAD_SECONDS || '3' };
      delete env.NODE_TEST_CONTEXT; // else the child reports to this runner instead of running its own
      const out = await new Promise((resolve, reject) => {
        execFile(process.execPath, ['--test', '--test-reporter=spec', path.join(here, 'load.test.mjs')], {
          env, maxBuffer: 16 << 20,
        }, (err, stdout, stderr) => (err ? reject(new Error(`load suite failed:\n${stdout}\n${stderr}`)) : resolve(stdout)));
      });
      for (const line of out.split('\n').filter((l) => /round \d:|RSS/.test(l))) t.diagnostic(line.trim());
      const st = await stats(s.url);
      t.diagnostic(`ssd_cache after the load: ${JSON.stringify(st)}`);
      assert.ok(st.writes > 0, 'the load wrote blocks behind');
      assert.equal(st.failed, 0);
      assert.equal(st.disabled, false);
      const f = await flush(s.url);
      assert.equal(f.status, 200, JSON.stringify(f.body));
    });
  });

  test('--generation-checkpoint: a stream cut by its client, sent again after a restart, resumes and gives the uninterrupted tokens', { timeout: 120000 * slow }, async () => {
    const req = { model: modelId, prompt: story.repeat(2), max_tokens: 40, temperature: 1, seed: 7, logprobs: 1 };
    const tokensOf = (r) => r.choices[0].logprobs.tokens.join('\u0001');
    // uninterrupted, no cache at all
    const whole = await withServer(fresh('ckpt-cold'), [], 'ckpt-cold', async (s) => client(s.url).completions.create(req));
    assert.equal(whole.choices[0].logprobs.tokens.length, 40);
    const dir = fresh('ckpt');
    await withServer(dir, ['--generation-checkpoint', '4'], 'ckpt-cut', async (s) => {
      const stream = await client(s.url).completions.create({ ...req, stream: true });
      let n = 0;
      for await (const chunk of stream) {
        n += chunk.choices[0]?.logprobs?.tokens?.length ?? 0;
        if (n >= 12) break; // the client goes away
      }
      const deadline = Date.now() + 10000 * slow;
      let st;
      do {
        await new Promise((r) => setTimeout(r, 100));
        st = (await (await fetch(`${s.url}/stats`)).json()).checkpoints;
      } while (st.saved < 1 && Date.now() < deadline);
      assert.ok(st.saved >= 1, `checkpoints: ${JSON.stringify(st)}`);
    });
    await withServer(dir, ['--generation-checkpoint', '4'], 'ckpt-resume', async (s) => {
      const again = await client(s.url).completions.create(req);
      const st = (await (await fetch(`${s.url}/stats`)).json()).checkpoints;
      assert.equal(st.resumed, 1, `checkpoints: ${JSON.stringify(st)}`);
      assert.equal(tokensOf(again), tokensOf(whole), 'the resumed generation gives the uninterrupted tokens');
      assert.deepEqual(again.choices[0].logprobs.token_logprobs, whole.choices[0].logprobs.token_logprobs);
      assert.equal(again.choices[0].text, whole.choices[0].text);
    });
  });

  test(`kill -9 during heavy writing, ${KILLS} times (bench/ssd_kill.sh): every answer after a restart is the cold run's, no crash`, { timeout: (KILLS * 40 + 60) * 1000 * slow }, async (t) => {
    const out = await new Promise((resolve, reject) => {
      execFile(path.join(root, 'bench', 'ssd_kill.sh'), [String(KILLS), modelDir, binary], {
        env: { ...process.env, SSD_KILL_LOGS: path.join(logDir, 'ssd-kill') }, maxBuffer: 16 << 20,
      }, (err, stdout, stderr) => (err ? reject(new Error(`bench/ssd_kill.sh failed:\n${stdout}\n${stderr}`)) : resolve(stdout)));
    });
    for (const line of out.trim().split('\n')) t.diagnostic(line);
    assert.match(out, /wrong answers 0, crashes 0, errors 0/);
  });
});
