// tests/e2e/isolate.test.mjs — serve --isolate: each model's engine in a child process. An engine child that crashes or hangs mid-stream is restarted; its request gets a 503 (streams: an SSE error event then [DONE]; Anthropic streams: an error event) while the other model's concurrent request finishes untouched; GET /engine counts the restarts; the restarted engine gives the same greedy answers; POST /admin/drain and /admin/lease answer on the admin socket (and not on the TCP port).
//
// The crash and the hang come from the test-only fault switch of inferd-faults (built beside inferd
// with -DINFERD_TEST_FAULTS=ON; never in a release binary): a prompt holding INFERD_TEST_FAULT=crash
// or =hang makes its engine child abort, or stop sending anything, once it has generated a token.
// Without that binary the fault tests are skipped and the rest runs on inferd itself.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { binary, client, modelDir, modelId, readTail, sleep, slow, startServer } from './lib/harness.mjs';

const faults = path.join(path.dirname(binary), 'inferd-faults');
const haveFaults = fs.existsSync(faults);
const noFaults = !haveFaults && `no ${faults} (configure with -DINFERD_TEST_FAULTS=ON)`;
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-iso-e2e-'));
const otherDir = path.join(work, 'iso-b');
const otherId = 'iso-b';
const adminSocket = path.join(work, 'admin.sock');
const watchdog = 2 * slow;
const story = 'The lighthouse keeper counted the ships that passed the headland every night and wrote their names in a ledger. ';
const convo = (q) => [{ role: 'system', content: story.repeat(2) }, { role: 'user', content: q }];

after(() => fs.rmSync(work, { recursive: true, force: true }));

const json = async (url, route) => (await fetch(`${url}${route}`)).json();

/* A request over the admin socket: resolves to {status, body} once the response ends. */
function adminRequest(method, route) {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: adminSocket, method, path: route }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/* POST /admin/lease: resolves once "leased" arrived, to a function that ends the lease. */
function takeLease() {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: adminSocket, method: 'POST', path: '/admin/lease' }, (res) => {
      assert.equal(res.statusCode, 200);
      res.once('data', (d) => {
        assert.equal(String(d), 'leased\n');
        resolve(() => req.destroy());
      });
    });
    req.on('error', (e) => { if (e.code !== 'ECONNRESET') reject(e); });
    req.end();
  });
}

async function ask(url, model, q = 'Who kept the ledger?', max = 12) {
  const r = await client(url).chat.completions.create({ model, temperature: 0, messages: convo(q), max_tokens: max });
  return r.choices[0].message.content;
}

/* A streamed chat completion, read whole: {status, text (the deltas joined), raw}. */
async function stream(url, model, q, max = 12) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, temperature: 0, messages: convo(q), max_tokens: max, stream: true }),
  });
  const raw = await r.text();
  let text = '';
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: {')) continue;
    const c = JSON.parse(line.slice(6));
    text += c.choices?.[0]?.delta?.content ?? '';
  }
  return { status: r.status, text, raw };
}

/* GET /engine once the child of id runs again after `restarts` restarts. */
async function restarted(url, id, restarts) {
  const deadline = Date.now() + 60000 * slow;
  for (;;) {
    const e = await json(url, '/engine');
    const c = e.engines.find((x) => x.id === id);
    if (c && c.state === 'running' && c.restarts >= restarts) return e;
    if (Date.now() > deadline) throw new Error(`the engine of ${id} did not come back: ${JSON.stringify(e)}`);
    await sleep(100);
  }
}

describe('engine isolation (--isolate)', () => {
  let s;
  const answers = {};

  before(async () => {
    execFileSync(binary, ['mkmodel', '--preset', 'tiny-qwen3', '--seed', '7', '--tokenizer', modelDir, '--out', otherDir], { stdio: 'ignore' });
    s = await startServer(['--isolate', '--watchdog-s', String(watchdog), '--admin-socket', adminSocket,
      '--mode', 'exact', '--kv-mb', '8', '--prompt-cache', '0.004', '--max-batch', '4',
      '--ssd-cache', path.join(work, 'ssd'), '--model-pool', otherDir], { name: 'isolate', bin: haveFaults ? faults : binary });
  });

  after(async () => {
    if (!s) return;
    const r = await s.stop(30000 * slow);
    assert.equal(r.code, 0, `exit ${JSON.stringify(r)}; stderr: ${readTail(s.errPath, 1500)}`);
  });

  test('GET /engine reports the engine children; both models answer', async () => {
    let e = await json(s.url, '/engine');
    assert.equal(e.isolated, true);
    assert.equal(typeof e.pid, 'number');
    assert.notEqual(e.pid, s.pid, 'pid is the engine child\'s, not the server\'s');
    assert.equal(e.supervisor_pid, s.pid);
    assert.equal(e.restarts, 0);
    assert.match(e.socket, /\.sock$/);
    assert.equal(e.admin_socket, adminSocket);
    assert.deepEqual(e.pool.resident, [modelId]);
    assert.equal(typeof e.response_store.entries, 'number', 'the supervisor keeps the stored responses');
    for (const id of [modelId, otherId]) answers[id] = await ask(s.url, id);
    assert.notEqual(answers[modelId], answers[otherId], 'two models, two answers');
    assert.equal(await ask(s.url, modelId), answers[modelId], 'greedy answers repeat');
    e = await json(s.url, '/engine');
    assert.equal(e.engines.length, 2, 'one child per model');
    assert.notEqual(e.engines[0].pid, e.engines[1].pid);
  });

  test('structured output crosses to the engine child: the reply follows the schema, and a bad schema is the same 400 as in process', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 8 }, count: { type: 'integer' } },
      required: ['name', 'count'], additionalProperties: false,
    };
    const r = await client(s.url).chat.completions.create({
      model: modelId, temperature: 0, messages: convo('Describe the ledger.'), max_tokens: 64,
      response_format: { type: 'json_schema', json_schema: { name: 'ledger', schema, strict: true } },
    });
    const v = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(Object.keys(v).sort(), ['count', 'name']);
    assert.equal(typeof v.name, 'string');
    assert.ok(Number.isInteger(v.count));
    await assert.rejects(
      client(s.url).chat.completions.create({
        model: modelId, messages: convo('x'), max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'no-such-type' } } },
      }),
      (e) => e.status === 400,
    );
    assert.equal(await ask(s.url, modelId), answers[modelId], 'plain requests are unchanged after it');
  });

  test('a crash mid-stream: an error event then [DONE]; the other model\'s concurrent stream is untouched; the restarted engine answers the same', { skip: noFaults }, async () => {
    const before = await json(s.url, '/engine');
    const [crashed, other] = await Promise.all([
      stream(s.url, modelId, 'INFERD_TEST_FAULT=crash tell me about the ships', 16),
      stream(s.url, otherId, 'Who kept the ledger?', 12),
    ]);
    assert.equal(crashed.status, 200);
    const events = crashed.raw.split('\n\n').filter((x) => x.startsWith('data: '));
    const err = events.find((x) => x.startsWith('data: {"error"'));
    assert.ok(err, `an error event: ${crashed.raw}`);
    const body = JSON.parse(err.slice(6));
    assert.match(body.error.message, /crashed.*restarted/);
    assert.equal(body.error.code, 'engine_unavailable');
    assert.equal(events.at(-1), 'data: [DONE]', 'the stream still ends with [DONE]');
    assert.ok(events.indexOf(err) >= 2, 'the error came mid-stream, after the role and a token');
    assert.equal(other.status, 200);
    assert.equal(other.text, answers[otherId], 'the other model\'s stream finished unchanged');
    assert.match(other.raw, /"finish_reason":"length"/);

    const e = await restarted(s.url, modelId, 1);
    const c = e.engines.find((x) => x.id === modelId);
    assert.equal(c.crashes, 1);
    assert.equal(e.restarts, before.restarts + 1, '/engine.restarts counts it');
    assert.notEqual(e.pid, before.pid, 'a fresh child');
    assert.equal(await ask(s.url, modelId), answers[modelId], 'the restarted engine answers as before');
  });

  test('a crash under a non-streaming request is a 503 that says so', { skip: noFaults }, async () => {
    const before = await json(s.url, '/engine');
    const r = await fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelId, temperature: 0, max_tokens: 16, messages: convo('INFERD_TEST_FAULT=crash again') }),
    });
    assert.equal(r.status, 503);
    const body = await r.json();
    assert.match(body.error.message, /crashed.*restarted/);
    assert.equal(body.error.code, 'engine_unavailable');
    const e = await restarted(s.url, modelId, before.engines.find((x) => x.id === modelId).restarts + 1);
    assert.equal(e.restarts, before.restarts + 1);
  });

  test('a hang mid-stream is caught by the watchdog: an Anthropic error event, then the engine serves again', { skip: noFaults }, async () => {
    const t0 = Date.now();
    const r = await fetch(`${s.url}/v1/messages`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: otherId, max_tokens: 16, temperature: 0, stream: true,
        messages: [{ role: 'user', content: 'INFERD_TEST_FAULT=hang count the ships' }] }),
    });
    assert.equal(r.status, 200);
    const raw = await r.text();
    assert.match(raw, /event: content_block_delta/, 'a token came before the hang');
    const m = /event: error\ndata: (.*)\n/.exec(raw);
    assert.ok(m, `an error event: ${raw}`);
    const body = JSON.parse(m[1]);
    assert.equal(body.type, 'error');
    assert.equal(body.error.type, 'overloaded_error', 'a 503 in Anthropic\'s words');
    assert.match(body.error.message, new RegExp(`hung \\(no step progress in ${watchdog} s\\)`));
    assert.ok(Date.now() - t0 >= watchdog * 1000, 'not before the watchdog\'s time');
    const e = await restarted(s.url, otherId, 1);
    assert.equal(e.engines.find((x) => x.id === otherId).hangs, 1);
    assert.equal(await ask(s.url, otherId), answers[otherId]);
  });

  test('POST /admin/drain and /admin/lease answer on the admin socket only', async () => {
    await ask(s.url, modelId, 'Who counted the ships at the headland?');
    const d = await adminRequest('POST', '/admin/drain');
    assert.equal(d.status, 200);
    const drained = JSON.parse(d.body);
    assert.equal(drained.drained, true);
    assert.ok(drained.demotions > 0, `cached blocks went to the SSD tier: ${d.body}`);
    assert.equal((await adminRequest('GET', '/admin/drain')).status, 405);
    assert.equal((await adminRequest('POST', '/v1/models')).status, 404);
    const tcp = await fetch(`${s.url}/admin/drain`, { method: 'POST' });
    assert.equal(tcp.status, 404, 'not on the TCP port');
    await tcp.text();

    const release = await takeLease();
    let e = await json(s.url, '/engine');
    assert.equal(e.leases, 1);
    assert.ok(e.engines.every((x) => x.paused), `every engine paused under the lease: ${JSON.stringify(e)}`);
    let done = false;
    const held = ask(s.url, modelId).then((a) => { done = true; return a; });
    await sleep(Math.max(1000, watchdog * 1000 + 500));
    assert.equal(done, false, 'no engine steps while the lease is held');
    release();
    assert.equal(await held, answers[modelId], 'it finishes once the lease ends, no watchdog kill');
    e = await json(s.url, '/engine');
    assert.equal(e.leases, 0);
    assert.ok(e.engines.every((x) => !x.paused && x.hangs <= 1));
  });
});
