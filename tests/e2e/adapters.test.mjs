// tests/e2e/adapters.test.mjs — LoRA adapters through the openai SDK: one mounted at start (--adapter), more mounted and unmounted over /v1/adapters, the `adapter` field changing the answer (stacked "a+b" too), never sharing cached prefixes across adapters, and the 400 / 404 / 409 answers; then the same under --isolate, where the registry lives in the engine child: the same greedy tokens as in process, and mounting and unmounting through the supervisor.
//
// The adapters are random PEFT adapters `inferd mkmodel --lora-for` writes for the suite's model.
// Exact mode, so the same request with the same adapter gives the same answer.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { binary, client, modelDir, readTail, slow, startServer, sleep } from './lib/harness.mjs';

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-adapters-e2e-'));
const adapterDir = path.join(work, 'adapters');
const dirOf = (id) => path.join(adapterDir, id);

after(() => fs.rmSync(work, { recursive: true, force: true }));

const json = async (url, route, init = {}) => {
  const r = await fetch(`${url}${route}`, {
    ...init,
    headers: { 'content-type': 'application/json', ...(init.headers || {}) },
  });
  return { status: r.status, body: await r.json() };
};

describe('adapters', () => {
  let server;
  let url;
  let openai;

  before(async () => {
    const make = (id, seed, extra) => execFileSync(binary, ['mkmodel', '--lora-for', modelDir, '--seed', String(seed),
      '--out', dirOf(id), ...extra], { stdio: 'ignore' });
    make('alpha', 1, ['--rank', '8', '--alpha', '32']);
    make('beta', 2, ['--rank', '4', '--targets', 'q_proj,k_proj,v_proj,o_proj']);
    make('gamma', 3, ['--rank', '16', '--targets', 'gate_proj,up_proj,down_proj']);
    server = await startServer(['--mode', 'exact', '--adapter', `alpha=${dirOf('alpha')}`, '--adapter-dir', adapterDir],
      { name: 'adapters' });
    url = server.url;
    openai = client(url);
  });

  after(async () => {
    if (!server)
      return;
    const r = await server.stop(30000 * slow);
    assert.equal(r.code, 0, `exit ${JSON.stringify(r)}; stderr: ${readTail(server.errPath, 1500)}`);
  });

  const chat = async (content, adapter, max_tokens = 12) => {
    const body = { model: 'any', temperature: 0, max_tokens, messages: [{ role: 'user', content }] };
    if (adapter !== undefined)
      body.adapter = adapter;
    const r = await openai.chat.completions.create(body);
    return { text: r.choices[0].message.content, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0,
      prompt: r.usage.prompt_tokens };
  };

  test('GET /v1/adapters lists the one mounted at start; /available lists the adapter directory', async () => {
    const { status, body } = await json(url, '/v1/adapters');
    assert.equal(status, 200);
    assert.equal(body.adapters.length, 1);
    const a = body.adapters[0];
    assert.equal(a.id, 'alpha');
    assert.equal(a.rank, 8);
    assert.equal(a.scale, 4);
    assert.ok(a.mounted_layers > 0 && a.ram_bytes > 0 && a.size_bytes > 0, JSON.stringify(a));
    const avail = await json(url, '/v1/adapters/available');
    assert.equal(avail.status, 200);
    const ids = Object.fromEntries(avail.body.adapters.map((x) => [x.id, x]));
    assert.deepEqual(Object.keys(ids).sort(), ['alpha', 'beta', 'gamma']);
    assert.equal(ids.alpha.mounted, true);
    assert.equal(ids.beta.mounted, false);
    assert.equal(ids.gamma.rank, 16);
    assert.equal(ids.beta.compatible, true);
  });

  test('the adapter field changes the answer; the same adapter answers the same', async () => {
    const q = 'Name three rivers of Europe.';
    const base = await chat(q);
    const none = await chat(q, 'none');
    const alpha = await chat(q, 'alpha');
    const again = await chat(q, 'alpha');
    assert.equal(none.text, base.text, 'adapter "none" is the base model');
    assert.notEqual(alpha.text, base.text, 'the adapter changes the greedy answer');
    assert.equal(again.text, alpha.text);
  });

  test('a cached prefix never crosses adapters', async () => {
    // a long question nobody asked before: only the chat template's first tokens are shared
    const q = 'A question nobody asked before: which lighthouse keeper counted the most ships, and why? '.repeat(4);
    const first = await chat(q, 'alpha', 4);
    assert.ok(first.prompt > 40);
    const base = await chat(q, undefined, 4);
    assert.ok(base.cached < 16, `the base model found ${base.cached} of ${base.prompt} prompt tokens the adapter computed`);
    const second = await chat(q, 'alpha', 4);
    assert.ok(second.cached >= first.prompt - 16, `the adapter's own prefix is found again (${second.cached} of ${second.prompt})`);
    assert.equal(second.text, first.text);
    const beta = await chat(q, 'alpha+alpha', 4);
    assert.ok(beta.cached < 16, 'another stack is another namespace');
  });

  test('POST /v1/adapters mounts; stacked adapters answer differently from each alone', async () => {
    let r = await json(url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'beta', path: dirOf('beta') }) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.id, 'beta');
    assert.equal(r.body.rank, 4);
    assert.ok(r.body.mounted_layers > 0);
    r = await json(url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'gamma', path: dirOf('gamma') }) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const q = 'Write a line about the sea.';
    const answers = {};
    for (const spec of ['none', 'beta', 'gamma', 'beta+gamma', 'gamma+beta', 'alpha+beta+gamma'])
      answers[spec] = (await chat(q, spec)).text;
    assert.notEqual(answers['beta+gamma'], answers.beta);
    assert.notEqual(answers['beta+gamma'], answers.gamma);
    assert.notEqual(answers.beta, answers.none);
    // a stack sums its updates: the order may change rounding, not the answer's meaning; both run
    assert.equal(typeof answers['gamma+beta'], 'string');
    const list = (await json(url, '/v1/adapters')).body.adapters.map((a) => a.id).sort();
    assert.deepEqual(list, ['alpha', 'beta', 'gamma']);
  });

  test('other APIs take the adapter field too', async () => {
    const c = await openai.completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, adapter: 'alpha' });
    const c0 = await openai.completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
    assert.notEqual(c.choices[0].text, c0.choices[0].text);
    const r = await openai.responses.create({ model: 'any', input: 'Once upon a time', max_output_tokens: 8, temperature: 0, adapter: 'alpha' });
    assert.equal(r.status === 'completed' || r.status === 'incomplete', true);
    const m = await json(url, '/v1/messages', { method: 'POST', body: JSON.stringify({ model: 'any', max_tokens: 8, adapter: 'nope', messages: [{ role: 'user', content: 'hi' }] }) });
    assert.equal(m.status, 400);
    assert.match(m.body.error.message, /adapter 'nope' not mounted/);
  });

  test('unknown adapters are a 400; bad mounts a 400; a taken id a 409; unmounting an unknown id a 404', async () => {
    await assert.rejects(chat('hi', 'nope'), (e) => e.status === 400 && /adapter 'nope' not mounted/.test(e.message));
    await assert.rejects(chat('hi', 'alpha+nope'), (e) => e.status === 400);
    let r = await json(url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'x' }) });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.message, 'id and path required');
    r = await json(url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'x', path: modelDir }) });
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /adapter_config\.json/);
    r = await json(url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'alpha', path: dirOf('beta') }) });
    assert.equal(r.status, 409);
    r = await json(url, '/v1/adapters/nope', { method: 'DELETE' });
    assert.equal(r.status, 404);
    assert.equal(r.body.error.message, 'adapter nope not mounted');
    r = await json(url, '/v1/adapters/elsewhere', { method: 'GET' });
    assert.equal(r.status, 404);
  });

  test('DELETE is a 409 while a request uses the adapter, then unmounts it', async () => {
    const stream = await openai.chat.completions.create({
      model: 'any', temperature: 0, max_tokens: 400, stream: true, adapter: 'gamma',
      messages: [{ role: 'user', content: 'Tell a long story.' }],
    });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    const busy = await json(url, '/v1/adapters/gamma', { method: 'DELETE' });
    assert.equal(busy.status, 409, JSON.stringify(busy.body));
    assert.match(busy.body.error.message, /in use/);
    stream.controller.abort();
    // the cancelled sequence lets go at the engine's next step
    let r;
    for (let i = 0; i < 100; i++) {
      r = await json(url, '/v1/adapters/gamma', { method: 'DELETE' });
      if (r.status !== 409)
        break;
      await sleep(50);
    }
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.id, 'gamma');
    assert.ok(r.body.removed_layers > 0);
    await assert.rejects(chat('hi', 'gamma'), (e) => e.status === 400);
    const list = (await json(url, '/v1/adapters')).body.adapters.map((a) => a.id).sort();
    assert.deepEqual(list, ['alpha', 'beta']);
  });
});

describe('adapters under --isolate', () => {
  let plain;
  let iso;

  before(async () => {
    for (const [id, seed, extra] of [['alpha', 1, ['--rank', '8', '--alpha', '32']], ['beta', 2, ['--rank', '4', '--targets', 'q_proj,k_proj,v_proj,o_proj']]])
      if (!fs.existsSync(dirOf(id)))
        execFileSync(binary, ['mkmodel', '--lora-for', modelDir, '--seed', String(seed), '--out', dirOf(id), ...extra], { stdio: 'ignore' });
    const flags = ['--mode', 'exact', '--adapter', `alpha=${dirOf('alpha')}`, '--adapter-dir', adapterDir];
    plain = await startServer(flags, { name: 'adapters-plain' });
    iso = await startServer([...flags, '--isolate'], { name: 'adapters-isolate' });
  });

  after(async () => {
    for (const s of [iso, plain]) {
      if (!s)
        continue;
      const r = await s.stop(30000 * slow);
      assert.equal(r.code, 0, `exit ${JSON.stringify(r)}; stderr: ${readTail(s.errPath, 1500)}`);
    }
  });

  const tokens = async (url, adapter, content = 'Name three rivers of Europe.') => {
    const body = { model: 'any', temperature: 0, max_tokens: 12, logprobs: true, messages: [{ role: 'user', content }] };
    if (adapter !== undefined)
      body.adapter = adapter;
    const r = await client(url).chat.completions.create(body);
    return { text: r.choices[0].message.content, tokens: r.choices[0].logprobs.content.map((t) => t.token) };
  };

  test('an adapter picked per request gives the same greedy tokens through the engine child as in process', async () => {
    const base = await tokens(iso.url);
    const alpha = await tokens(iso.url, 'alpha');
    assert.notEqual(alpha.text, base.text, 'the adapter changes the greedy answer under --isolate');
    assert.deepEqual(alpha.tokens, (await tokens(plain.url, 'alpha')).tokens);
    assert.deepEqual(base.tokens, (await tokens(plain.url, 'none')).tokens);
    assert.deepEqual((await tokens(iso.url, 'alpha+alpha')).tokens, (await tokens(plain.url, 'alpha+alpha')).tokens);
    await assert.rejects(tokens(iso.url, 'nope'), (e) => e.status === 400 && /adapter 'nope' not mounted/.test(e.message));
  });

  test('/v1/adapters mounts, lists and unmounts in the engine child, 409 while a request uses the adapter', async () => {
    let r = await json(iso.url, '/v1/adapters');
    assert.equal(r.status, 200);
    assert.deepEqual(r.body.adapters.map((a) => [a.id, a.rank, a.scale]), [['alpha', 8, 4]]);
    r = await json(iso.url, '/v1/adapters/available');
    assert.equal(r.status, 200);
    assert.deepEqual(r.body.adapters.map((a) => a.id).sort(), fs.readdirSync(adapterDir).sort());
    assert.equal(r.body.adapters.find((a) => a.id === 'alpha').mounted, true);

    for (const s of [plain, iso]) {
      r = await json(s.url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'beta', path: dirOf('beta') }) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.rank, 4);
    }
    assert.deepEqual((await tokens(iso.url, 'beta')).tokens, (await tokens(plain.url, 'beta')).tokens);
    r = await json(iso.url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'beta', path: dirOf('beta') }) });
    assert.equal(r.status, 409);
    r = await json(iso.url, '/v1/adapters', { method: 'POST', body: JSON.stringify({ id: 'x', path: modelDir }) });
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /adapter_config\.json/);
    r = await json(iso.url, '/v1/adapters/nope', { method: 'DELETE' });
    assert.equal(r.status, 404);
    assert.equal(r.body.error.message, 'adapter nope not mounted');

    const stream = await client(iso.url).chat.completions.create({
      model: 'any', temperature: 0, max_tokens: 400, stream: true, adapter: 'beta',
      messages: [{ role: 'user', content: 'Tell a long story.' }],
    });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    const busy = await json(iso.url, '/v1/adapters/beta', { method: 'DELETE' });
    assert.equal(busy.status, 409, JSON.stringify(busy.body));
    assert.match(busy.body.error.message, /in use/);
    assert.equal((await json(iso.url, '/v1/adapters')).body.adapters.find((a) => a.id === 'beta').in_use, 1);
    stream.controller.abort();
    for (let i = 0; i < 100; i++) {
      r = await json(iso.url, '/v1/adapters/beta', { method: 'DELETE' });
      if (r.status !== 409)
        break;
      await sleep(50);
    }
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(r.body.removed_layers > 0);
    await assert.rejects(tokens(iso.url, 'beta'), (e) => e.status === 400);
    assert.deepEqual((await json(iso.url, '/v1/adapters')).body.adapters.map((a) => a.id), ['alpha']);
  });
});
