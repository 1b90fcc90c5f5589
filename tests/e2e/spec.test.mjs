// tests/e2e/spec.test.mjs — speculative decoding through a real server: the house pair served with --draft-model (whole vocabulary or --draft-vocab) and prompt lookup in exact mode answers exactly as the plain server does, the openai SDK sees usage.speculation and usage.lane, speculative:false turns it off, streaming works.
//
// Every test starts its own servers (harness startServer) on the house models, which ship with the
// tree: models/house as the target, models/house-draft as its draft.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { client, readTail, slow, startServer } from './lib/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const house = path.join(root, 'models', 'house');
const draft = path.join(root, 'models', 'house-draft');
const prompt = 'In the beginning God created the heaven and the earth. And the earth was without form, and void;';
const greedy = { model: 'house', temperature: 0, max_tokens: 24 };

async function withServer(extra, name, use) {
  const s = await startServer(['--mode', 'exact', '--threads', '2', ...extra], { name, model: house });
  try {
    return await use(s);
  } finally {
    const r = await s.stop(30000 * slow);
    assert.equal(r.code, 0, `${name}: exit ${JSON.stringify(r)}; stderr: ${readTail(s.errPath, 1500)}`);
  }
}

const complete = (url, extra = {}) => client(url).completions.create({ ...greedy, prompt, ...extra });
const chat = (url, extra = {}) => client(url).chat.completions.create({
  ...greedy, messages: [{ role: 'user', content: prompt }], ...extra,
});

describe('speculative decoding', () => {
  let plain;
  before(async () => {
    plain = await withServer([], 'spec-plain', async (s) => ({
      completion: (await complete(s.url)).choices[0].text,
      chat: (await chat(s.url)).choices[0].message.content,
      lane: (await complete(s.url)).usage.lane,
    }));
  });

  test('the plain server reports its lane and no speculation', () => {
    assert.equal(plain.lane, 'serial');
  });

  test('with --draft-model the answers are the plain ones and usage says how they ran', async () => {
    await withServer(['--draft-model', draft], 'spec-two-model', async (s) => {
      const c = await complete(s.url);
      assert.equal(c.choices[0].text, plain.completion);
      assert.equal(c.usage.lane, 'serial+spec');
      const sp = c.usage.speculation;
      assert.ok(sp && sp.targetCalls > 0 && sp.drafted > 0, JSON.stringify(c.usage));
      assert.ok(sp.accepted >= 0 && sp.accepted <= sp.drafted);
      assert.ok(sp.targetCalls < c.usage.completion_tokens, 'verification saved no target step');

      const m = await chat(s.url);
      assert.equal(m.choices[0].message.content, plain.chat);
      assert.equal(m.usage.lane, 'serial+spec');
      assert.ok(m.usage.speculation.targetCalls > 0);

      const off = await complete(s.url, { speculative: false });
      assert.equal(off.choices[0].text, plain.completion);
      assert.equal(off.usage.lane, 'serial');
      assert.equal(off.usage.speculation, undefined);

      /* streamed: the same text, usage in the last chunk */
      const stream = await client(s.url).chat.completions.create({
        ...greedy, messages: [{ role: 'user', content: prompt }], stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      let usage;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      assert.equal(text, plain.chat);
      assert.equal(usage.lane, 'serial+spec');
      assert.ok(usage.speculation.targetCalls > 0);

      const stats = await (await fetch(`${s.url}/stats`)).json();
      assert.equal(stats.speculative.kind, 'two-model');
      /* the head's rows chosen as the draft runs, by default: some of the 8,192, in buckets */
      assert.equal(stats.speculative.draft_vocab_auto, true);
      assert.ok(stats.speculative.draft_vocab > 0 && stats.speculative.draft_vocab <= 8192 &&
                stats.speculative.draft_vocab % 256 === 0, String(stats.speculative.draft_vocab));
      assert.ok(stats.speculative.verify_steps > 0);
      assert.ok(stats.speculative.acceptance_rate > 0 && stats.speculative.acceptance_rate <= 1);
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      assert.match(metrics, /inferd_spec_acceptance_rate [0-9.]+/);
      assert.match(metrics, /inferd_spec_mean_accepted_length [0-9.]+/);
      assert.match(metrics, /inferd_spec_verify_steps_total [1-9]/);
    });
  });

  test('a draft limited to the first token ids (--draft-vocab) gives the plain answers', async () => {
    await withServer(['--draft-model', draft, '--draft-vocab', '2048'], 'spec-draft-vocab', async (s) => {
      const c = await complete(s.url);
      assert.equal(c.choices[0].text, plain.completion);
      assert.ok(c.usage.speculation.targetCalls > 0, JSON.stringify(c.usage));
      const stats = await (await fetch(`${s.url}/stats`)).json();
      assert.equal(stats.speculative.draft_vocab, 2048);
      assert.equal(stats.speculative.draft_vocab_auto, false);
    });
  });

  test('--draft-vocab all reads the whole head', async () => {
    await withServer(['--draft-model', draft, '--draft-vocab', 'all'], 'spec-draft-all', async (s) => {
      const c = await complete(s.url);
      assert.equal(c.choices[0].text, plain.completion);
      const stats = await (await fetch(`${s.url}/stats`)).json();
      assert.equal(stats.speculative.draft_vocab, 8192);
      assert.equal(stats.speculative.draft_vocab_auto, false);
    });
  });

  test('prompt lookup gives the plain answers too', async () => {
    await withServer(['--draft-kind', 'ngram'], 'spec-ngram', async (s) => {
      const c = await complete(s.url);
      assert.equal(c.choices[0].text, plain.completion);
      assert.ok(c.usage.speculation, JSON.stringify(c.usage));
    });
  });

  test('speculative must be a boolean', async () => {
    await withServer(['--draft-kind', 'ngram'], 'spec-bad', async (s) => {
      const r = await fetch(`${s.url}/v1/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...greedy, prompt, speculative: 'no' }),
      });
      assert.equal(r.status, 400);
      const body = await r.json();
      assert.match(body.error.message, /speculative/);
    });
  });
});
