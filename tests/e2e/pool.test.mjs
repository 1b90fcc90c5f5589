// tests/e2e/pool.test.mjs — several models in one server (--model-pool): requests routed by `model`, unknown ids a 404 in each API's shape, models loaded on first use, a --pool-memory that fits one model unloading the least recently used (greedy answers unchanged across unload and reload), and an unloaded model's cached prefixes found on disk after its next load.
//
// Two tiny models of the same preset and tokenizer, different seeds (so different answers): the
// suite's model (the default) and one made here with `mkmodel --seed 7`. Exact mode, so an answer
// over restored K/V equals a cold run's.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { binary, client, modelDir, modelId, readTail, slow, startServer } from './lib/harness.mjs';

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-pool-e2e-'));
const otherDir = path.join(work, 'pool-b');
const otherId = 'pool-b';
const story = 'The lighthouse keeper counted the ships that passed the headland every night, wrote their names in a ledger, '
  + 'and listened to the wind in the rigging of the old boats moored below the cliffs. ';
const convo = (q) => [{ role: 'system', content: story.repeat(3) }, { role: 'user', content: q }];
/* Small KV pools, so a model's resident bytes are mostly its weights and a limit can fit one. */
const sizes = ['--mode', 'exact', '--kv-mb', '8', '--prompt-cache', '0.004', '--max-batch', '2'];

after(() => fs.rmSync(work, { recursive: true, force: true }));

async function ask(url, model, q = 'Who kept the ledger?') {
  const r = await client(url).chat.completions.create({ model, temperature: 0, messages: convo(q), max_tokens: 10 });
  return { model: r.model, text: r.choices[0].message.content, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

const json = async (url, route) => (await fetch(`${url}${route}`)).json();
const rows = async (url) => Object.fromEntries((await json(url, '/v1/models')).data.map((m) => [m.id, m]));

async function withServer(extra, name, use) {
  const s = await startServer([...sizes, '--model-pool', otherDir, ...extra], { name });
  try {
    return await use(s);
  } finally {
    const r = await s.stop(30000 * slow);
    assert.equal(r.code, 0, `${name}: exit ${JSON.stringify(r)}; stderr: ${readTail(s.errPath, 1500)}`);
  }
}

describe('model pool', () => {
  const answers = {};
  let bytes = 0;

  before(() => {
    execFileSync(binary, ['mkmodel', '--preset', 'tiny-qwen3', '--seed', '7', '--tokenizer', modelDir, '--out', otherDir], { stdio: 'ignore' });
  });

  test('requests pick their model by id; the other loads on first use; unknown ids are 404 in each API\'s shape', async () => {
    await withServer([], 'pool-routing', async ({ url }) => {
      let m = await rows(url);
      assert.deepEqual(Object.keys(m).sort(), [modelId, otherId].sort());
      assert.equal(m[modelId].state, 'resident', 'the default loads at start');
      assert.equal(m[modelId].default, true);
      assert.equal(m[otherId].state, 'unloaded', 'the others on first use');
      for (let round = 0; round < 3; round++)
        for (const id of [modelId, otherId]) {
          const a = await ask(url, id);
          assert.equal(a.model, id, 'the reply names the model that answered');
          if (round === 0) answers[id] = a.text;
          else assert.equal(a.text, answers[id], `${id}: the same greedy answer every time`);
        }
      assert.notEqual(answers[modelId], answers[otherId], 'two models, two answers');
      const none = await ask(url, undefined);
      assert.equal(none.model, modelId, 'no model: the default');
      m = await rows(url);
      assert.equal(m[otherId].state, 'resident');
      assert.equal(m[otherId].loads, 1);
      bytes = Math.max(m[modelId].bytes, m[otherId].bytes);
      assert.ok(bytes > 0, 'resident models report their bytes');

      await assert.rejects(ask(url, 'no-such-model'), (e) => e.status === 404 && e.code === 'model_not_found');
      const r = await fetch(`${url}/v1/messages`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }),
      });
      assert.equal(r.status, 404);
      const body = await r.json();
      assert.equal(body.type, 'error', 'Anthropic\'s error shape');
      assert.match(body.error.message, /no-such-model/);
      assert.equal((await fetch(`${url}/v1/models/no-such-model`)).status, 404);
      assert.equal((await json(url, `/v1/models/${otherId}`)).id, otherId);

      const st = (await json(url, '/stats')).pool;
      assert.equal(st.default, modelId);
      assert.equal(st.models.length, 2);
      assert.ok(st.models.every((x) => x.state === 'resident' && x.load_s_last > 0));
      const eng = await json(url, '/engine');
      assert.equal(eng.isolated, false);
      assert.equal(eng.pool.default, modelId);
      assert.deepEqual(eng.pool.resident.sort(), [modelId, otherId].sort());
      const prom = await (await fetch(`${url}/metrics`)).text();
      assert.match(prom, new RegExp(`inferd_pool_model_resident\\{model="${otherId}"\\} 1`));
    });
  });

  test('a memory limit that fits one model unloads the least recently used; answers survive unload and reload, and the cache comes back from disk', async () => {
    assert.ok(bytes > 0, 'the routing test measured the models');
    const limitGB = (bytes * 1.5) / 1e9; /* one model, not two */
    const ssd = path.join(work, 'ssd');
    await withServer(['--pool-memory', String(limitGB), '--ssd-cache', ssd, '--ssd-restore', 'always'], 'pool-limit', async ({ url }) => {
      const first = await ask(url, modelId);
      assert.equal(first.text, answers[modelId]);
      for (let round = 0; round < 2; round++) {
        const b = await ask(url, otherId);
        assert.equal(b.text, answers[otherId], `round ${round}: ${otherId} answers as it did alone`);
        let m = await rows(url);
        assert.equal(m[modelId].state, 'unloaded', `round ${round}: loading ${otherId} unloaded ${modelId}`);
        const a = await ask(url, modelId);
        assert.equal(a.text, answers[modelId], `round ${round}: ${modelId} answers the same after its reload`);
        assert.ok(a.cached > 0, `round ${round}: the reloaded model found its cached prefix on disk (cached_tokens ${a.cached})`);
        m = await rows(url);
        assert.equal(m[otherId].state, 'unloaded');
      }
      const st = (await json(url, '/stats')).pool;
      const row = st.models.find((x) => x.id === modelId);
      assert.equal(row.loads, 3);
      assert.equal(row.unloads, 2);
      assert.ok(row.demotions > 0, 'its cached blocks went to disk as it left');
      assert.ok(st.evictions >= 4);
      assert.ok(st.resident_bytes <= st.memory_limit_bytes);
      assert.ok(fs.existsSync(path.join(ssd, modelId)) && fs.existsSync(path.join(ssd, otherId)), 'each model its own SSD directory');
    });
  });

  test('a pool file names models and sets their options; bad files are refused at start', async () => {
    const file = path.join(work, 'pool.json');
    fs.writeFileSync(file, JSON.stringify([{ id: 'second', path: 'pool-b', options: { context: 256 } }]));
    await withServer(['--model-pool', file], 'pool-file', async ({ url }) => {
      const m = await rows(url);
      assert.deepEqual(Object.keys(m).sort(), [modelId, otherId, 'second'].sort());
      const a = await ask(url, 'second');
      assert.equal(a.text, answers[otherId]);
      assert.equal((await rows(url)).second.context_window, 256);
    });
    fs.writeFileSync(file, JSON.stringify([{ path: 'pool-b', options: { contxt: 256 } }]));
    const out = (() => {
      try {
        execFileSync(binary, ['serve', modelDir, '--port', '0', '--model-pool', file], { stdio: 'pipe' });
        return '';
      } catch (e) {
        return `${e.status} ${e.stderr}`;
      }
    })();
    assert.match(out, /^1 .*options\.contxt: unknown option/s);
  });
});
