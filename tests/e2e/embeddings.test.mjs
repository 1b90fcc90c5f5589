// tests/e2e/embeddings.test.mjs — POST /v1/embeddings through the official openai SDK: input shapes, unit-length vectors, base64 equal to float, dimensions, errors, and embeddings computed beside a streaming chat.
//
// The test model (tiny-qwen3 with Qwen3's tokenizer) has random weights: what is checked is the
// shape of the answers and what holds for any model (unit length, the same input giving the same
// vector however it is sent and whatever it is batched with).
import { execFileSync } from 'node:child_process';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { binary, modelDir, modelId, useMainServer } from './lib/harness.mjs';

let server;
let openai;

useMainServer((s, c) => {
  server = s;
  openai = c;
});

const HIDDEN = JSON.parse(execFileSync('cat', [`${modelDir}/config.json`]).toString()).hidden_size;

/* The ids the server encodes text to (special tokens added, as /v1/embeddings does). */
function tokens(text) {
  const out = execFileSync(binary, ['tokenize', modelDir, '--jsonl'], { input: JSON.stringify(text) + '\n' });
  return JSON.parse(out.toString());
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

function assertClose(a, b, tol, what) {
  assert.equal(a.length, b.length, `${what}: lengths ${a.length} and ${b.length}`);
  for (let i = 0; i < a.length; i++)
    assert.ok(Math.abs(a[i] - b[i]) <= tol, `${what}: [${i}] ${a[i]} against ${b[i]}`);
}

async function post(body) {
  const r = await fetch(`${server.url}/v1/embeddings`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

describe('embeddings.create', () => {
  test('a string gives one unit-length vector of the hidden size, with usage', async () => {
    const r = await openai.embeddings.create({ model: modelId, input: 'The quick brown fox', encoding_format: 'float' });
    assert.equal(r.object, 'list');
    assert.equal(r.model, modelId);
    assert.equal(r.data.length, 1);
    assert.equal(r.data[0].object, 'embedding');
    assert.equal(r.data[0].index, 0);
    assert.equal(r.data[0].embedding.length, HIDDEN);
    assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5, `norm ${norm(r.data[0].embedding)}`);
    const n = tokens('The quick brown fox').length;
    assert.equal(r.usage.prompt_tokens, n);
    assert.equal(r.usage.total_tokens, n);
  });

  test('an array of strings keeps its order, and equal inputs give equal vectors', async () => {
    const input = ['alpha beta', 'gamma', 'alpha beta'];
    const r = await openai.embeddings.create({ model: modelId, input, encoding_format: 'float' });
    assert.deepEqual(r.data.map((d) => d.index), [0, 1, 2]);
    for (const d of r.data) assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
    assertClose(r.data[0].embedding, r.data[2].embedding, 0, 'the same text twice');
    const alone = await openai.embeddings.create({ model: modelId, input: 'gamma', encoding_format: 'float' });
    assertClose(alone.data[0].embedding, r.data[1].embedding, 1e-6, 'alone and among others');
    assert.equal(r.usage.prompt_tokens, input.reduce((s, t) => s + tokens(t).length, 0));
  });

  test('token ids, and arrays of them, give what their text gives', async () => {
    const text = 'Embeddings from token ids';
    const ids = tokens(text);
    const [fromText, fromIds, fromArrays] = await Promise.all([
      openai.embeddings.create({ model: modelId, input: text, encoding_format: 'float' }),
      openai.embeddings.create({ model: modelId, input: ids, encoding_format: 'float' }),
      openai.embeddings.create({ model: modelId, input: [ids, tokens('other')], encoding_format: 'float' }),
    ]);
    assertClose(fromIds.data[0].embedding, fromText.data[0].embedding, 1e-6, 'ids against text');
    assertClose(fromArrays.data[0].embedding, fromText.data[0].embedding, 1e-6, 'nested ids against text');
    assert.equal(fromArrays.data.length, 2);
  });

  test('base64 is the little-endian float32 of the float answer; the SDK default decodes it', async () => {
    const input = 'base64 or float';
    const f = await openai.embeddings.create({ model: modelId, input, encoding_format: 'float' });
    const b = await openai.embeddings.create({ model: modelId, input, encoding_format: 'base64' });
    assert.equal(typeof b.data[0].embedding, 'string');
    const buf = Buffer.from(b.data[0].embedding, 'base64');
    assert.equal(buf.length, HIDDEN * 4);
    const decoded = Array.from({ length: HIDDEN }, (_, i) => buf.readFloatLE(i * 4));
    assertClose(decoded, f.data[0].embedding, 1e-7 * 4, 'base64 decoded');
    // without encoding_format the SDK asks for base64 and hands back floats
    const d = await openai.embeddings.create({ model: modelId, input });
    assert.ok(Array.isArray(d.data[0].embedding));
    assertClose(d.data[0].embedding, f.data[0].embedding, 1e-6, 'the SDK default');
  });

  test('dimensions keeps the first d components, re-normalised', async () => {
    const input = 'shorter vectors';
    const full = await openai.embeddings.create({ model: modelId, input, encoding_format: 'float' });
    const r = await openai.embeddings.create({ model: modelId, input, dimensions: 16, encoding_format: 'float' });
    assert.equal(r.data[0].embedding.length, 16);
    assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
    const head = full.data[0].embedding.slice(0, 16);
    const scale = norm(head);
    assertClose(r.data[0].embedding, head.map((x) => x / scale), 1e-5, 'truncated and re-normalised');
  });

  test('embeddings are computed while a chat streams', async () => {
    const stream = await openai.chat.completions.create({
      model: modelId, temperature: 0, max_tokens: 24, stream: true,
      messages: [{ role: 'user', content: 'Count to ten.' }],
    });
    const [emb] = await Promise.all([
      openai.embeddings.create({ model: modelId, input: ['while', 'streaming'], encoding_format: 'float' }),
      (async () => { for await (const _ of stream); })(),
    ]);
    assert.equal(emb.data.length, 2);
  });
});

describe('embeddings errors', () => {
  test('dimensions above the hidden size is a 400 naming the parameter', async () => {
    await assert.rejects(
      openai.embeddings.create({ model: modelId, input: 'x', dimensions: HIDDEN + 1 }),
      (e) => e.status === 400 && e.param === 'dimensions',
    );
  });

  test('an input longer than the context is a 400', async () => {
    const ids = Array.from({ length: 5000 }, (_, i) => (i * 7) % 100);
    const r = await post({ model: modelId, input: ids });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, 'context_length_exceeded');
  });

  test('empty inputs, bad token ids, bad formats and bad shapes are 400s', async () => {
    for (const body of [
      { model: modelId, input: '' },
      { model: modelId, input: [] },
      { model: modelId, input: [-1] },
      { model: modelId, input: [[1, 2], [1e9]] },
      { model: modelId, input: [{ text: 'x' }] },
      { model: modelId, input: 'x', encoding_format: 'int8' },
      { model: modelId, input: 'x', dimensions: 0 },
      { model: modelId },
    ]) {
      const r = await post(body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.error.type, 'invalid_request_error', JSON.stringify(r.body));
    }
  });
});
