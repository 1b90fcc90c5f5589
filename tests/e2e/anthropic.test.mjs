// tests/e2e/anthropic.test.mjs — inferd serve through the official Anthropic SDK: messages.create and messages.stream (finalMessage), system blocks, stop sequences, thinking with its budget, count_tokens, cache counts, typed errors and API keys.
//
// The test model has random weights, so its text is arbitrary; what is checked is the protocol
// and the properties that hold for any model (greedy determinism, stop-sequence cuts, counts).
import { execFileSync } from 'node:child_process';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { binary, modelDir, modelId, slow, startServer, useMainServer } from './lib/harness.mjs';

let server;
let anthropic;

/* A client sending x-api-key (apiKey), or Authorization: Bearer (authToken). */
const sdk = (url, opts = {}) =>
  new Anthropic({ baseURL: url, ...(opts.authToken ? { authToken: opts.authToken } : { apiKey: opts.apiKey ?? 'unused' }), maxRetries: 0, timeout: 120000 * slow });

useMainServer((s) => {
  server = s;
  anthropic = sdk(s.url);
});

const hello = [{ role: 'user', content: 'Say hello.' }];
/* Greedy, and without the template's thinking, so the text is plain and repeatable. */
const plain = { model: modelId, temperature: 0, thinking: { type: 'disabled' } };

const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

/* How many ids the tokenizer gives text on its own. */
function tokenCount(text) {
  const out = execFileSync(binary, ['tokenize', modelDir, '--jsonl', '--no-special'], { input: JSON.stringify(text) + '\n' });
  return JSON.parse(out.toString()).length;
}

describe('messages', () => {
  test('create returns a message: msg_ id, assistant role, a text block, stop_reason and usage', async () => {
    const m = await anthropic.messages.create({ ...plain, max_tokens: 8, messages: hello });
    assert.match(m.id, /^msg_[0-9a-f]{24}$/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(typeof m.model, 'string');
    assert.ok(m.content.length >= 1);
    assert.equal(m.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
    assert.equal(m.stop_sequence, null);
    assert.ok(m.usage.input_tokens > 0);
    assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 8);
    assert.equal(typeof m.usage.cache_read_input_tokens, 'number');
    assert.equal(typeof m.usage.cache_creation_input_tokens, 'number');
  });

  test('messages.stream() assembles the same message as create (finalMessage, text events)', async () => {
    const want = await anthropic.messages.create({ ...plain, max_tokens: 12, messages: hello });
    const stream = anthropic.messages.stream({ ...plain, max_tokens: 12, messages: hello });
    let streamed = '';
    stream.on('text', (t) => { streamed += t; });
    const got = await stream.finalMessage();
    assert.match(got.id, /^msg_/);
    assert.equal(textOf(got), textOf(want));
    assert.equal(streamed, textOf(want));
    assert.equal(got.stop_reason, want.stop_reason);
    assert.equal(got.usage.output_tokens, want.usage.output_tokens);
    assert.equal(got.usage.input_tokens, want.usage.input_tokens);
  });

  test('stream: true through create yields the event grammar in order', async () => {
    const events = [];
    for await (const e of await anthropic.messages.create({ ...plain, max_tokens: 6, messages: hello, stream: true })) events.push(e);
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(types[1], 'content_block_start');
    assert.ok(types.includes('content_block_stop'));
    const delta = events.at(-2);
    assert.ok(['end_turn', 'max_tokens'].includes(delta.delta.stop_reason));
    assert.ok(delta.usage.output_tokens > 0);
  });

  test('system as text blocks is the same prompt as system as a string', async () => {
    const base = { ...plain, max_tokens: 4, messages: hello };
    const s = await anthropic.messages.create({ ...base, system: 'Be brief.' });
    const b = await anthropic.messages.create({ ...base, system: [{ type: 'text', text: 'Be brief.' }] });
    const none = await anthropic.messages.create(base);
    assert.equal(b.usage.input_tokens, s.usage.input_tokens);
    assert.equal(textOf(b), textOf(s));
    assert.ok(s.usage.input_tokens > none.usage.input_tokens);
  });

  test('a stop sequence from the greedy output ends the text before it: stop_reason stop_sequence', async () => {
    const messages = [{ role: 'user', content: 'Write something long.' }];
    const full = textOf(await anthropic.messages.create({ ...plain, max_tokens: 24, messages }));
    const chars = [...full];
    assert.ok(chars.length >= 4, `greedy output too short: ${JSON.stringify(full)}`);
    // A non-blank character from the middle; the text must stop at its first occurrence.
    let stop = null;
    for (let i = Math.floor(chars.length / 2); i < chars.length && !stop; i++) {
      if (chars[i].trim() !== '') stop = chars[i];
    }
    assert.ok(stop, `no usable stop character in ${JSON.stringify(full)}`);
    const m = await anthropic.messages.create({ ...plain, max_tokens: 24, messages, stop_sequences: ['\u0001never', stop] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(textOf(m), full.slice(0, full.indexOf(stop)));
    const streamed = await anthropic.messages.stream({ ...plain, max_tokens: 24, messages, stop_sequences: [stop] }).finalMessage();
    assert.equal(streamed.stop_reason, 'stop_sequence');
    assert.equal(streamed.stop_sequence, stop);
    assert.equal(textOf(streamed), textOf(m));
  });

  test('any model name is accepted and the reply names the served model, as chat completions does', async () => {
    const m = await anthropic.messages.create({ ...plain, model: 'claude-sonnet-4-5', max_tokens: 2, messages: hello });
    assert.equal(m.model, modelId);
  });

  test('a conversation with tools, tool_use, tool_result (blocks, is_error) and tool_choice is served', async () => {
    const tools = [{ name: 'get_weather', description: 'Weather by city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
    const messages = [
      { role: 'user', content: 'Weather in Paris and Rome?' },
      { role: 'assistant', content: [
        { type: 'text', text: 'Checking.' },
        { type: 'tool_use', id: 'toolu_a', name: 'get_weather', input: { city: 'Paris' } },
        { type: 'tool_use', id: 'toolu_b', name: 'get_weather', input: { city: 'Rome' } },
      ] },
      { role: 'user', content: [
        { type: 'tool_result', tool_use_id: 'toolu_a', content: [{ type: 'text', text: '12 C' }] },
        { type: 'tool_result', tool_use_id: 'toolu_b', content: 'service down', is_error: true },
        { type: 'text', text: 'Summarize.' },
      ] },
    ];
    const m = await anthropic.messages.create({ ...plain, max_tokens: 4, tools, tool_choice: { type: 'auto' }, messages });
    assert.ok(m.usage.input_tokens > 0);
    const without = await anthropic.messages.create({ ...plain, max_tokens: 4, tools, tool_choice: { type: 'none' }, messages });
    assert.ok(m.usage.input_tokens > without.usage.input_tokens, 'tool_choice none leaves the tools out of the prompt');
  });
});

describe('thinking', () => {
  test('thinking disabled: no thinking block; enabled: a thinking block first, then text', async () => {
    const off = await anthropic.messages.create({ ...plain, max_tokens: 8, messages: hello });
    assert.ok(off.content.every((b) => b.type !== 'thinking'));
    const budget = 4;
    const on = await anthropic.messages.create({ model: modelId, temperature: 0, max_tokens: 16, thinking: { type: 'enabled', budget_tokens: budget }, messages: hello });
    assert.equal(on.content[0].type, 'thinking', JSON.stringify(on.content));
    assert.equal(typeof on.content[0].signature, 'string');
    assert.ok(on.content[0].thinking.length > 0);
    // The random model would think until max_tokens: only the budget ends its thinking early.
    assert.equal(on.content.at(-1).type, 'text', JSON.stringify(on.content));
    assert.ok(on.content.at(-1).text.length > 0);
    const thinkingTokens = tokenCount(on.content[0].thinking);
    assert.ok(thinkingTokens <= budget + 1, `${thinkingTokens} thinking tokens for a budget of ${budget}`);
  });

  test('streamed thinking: finalMessage has the thinking block, then the text block', async () => {
    const req = { model: modelId, temperature: 0, max_tokens: 16, thinking: { type: 'enabled', budget_tokens: 4 }, messages: hello };
    const want = await anthropic.messages.create(req);
    const stream = anthropic.messages.stream(req);
    let thinking = '';
    stream.on('thinking', (t) => { thinking += t; });
    const got = await stream.finalMessage();
    assert.deepEqual(got.content.map((b) => b.type), want.content.map((b) => b.type));
    assert.equal(got.content[0].thinking, want.content[0].thinking);
    assert.equal(thinking, want.content[0].thinking);
    assert.equal(textOf(got), textOf(want));
  });
});

describe('count_tokens and the prompt cache', () => {
  test('count_tokens equals usage.input_tokens of the same request', async () => {
    const req = { model: modelId, system: [{ type: 'text', text: 'You count.' }], messages: [{ role: 'user', content: 'How many tokens is this prompt?' }], thinking: { type: 'disabled' } };
    const counted = await anthropic.messages.countTokens(req);
    const m = await anthropic.messages.create({ ...req, temperature: 0, max_tokens: 2 });
    assert.equal(counted.input_tokens, m.usage.input_tokens);
  });

  test('a repeated request reads its prompt from the cache: cache_read_input_tokens > 0', async () => {
    const system = 'You are a test assistant. '.repeat(20);
    const req = { ...plain, max_tokens: 2, system, messages: [{ role: 'user', content: 'Cache me.' }] };
    const first = await anthropic.messages.create(req);
    assert.ok(first.usage.cache_creation_input_tokens > 0, JSON.stringify(first.usage));
    const repeat = await anthropic.messages.create(req);
    assert.ok(repeat.usage.cache_read_input_tokens > 0, JSON.stringify(repeat.usage));
    assert.equal(repeat.usage.input_tokens, first.usage.input_tokens);
  });

  test('cache_control breakpoints are accepted and hold the prefix in a retention session', async () => {
    const system = [{ type: 'text', text: 'Retain this long system prompt. '.repeat(20), cache_control: { type: 'ephemeral' } }];
    const req = { ...plain, max_tokens: 2, system, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi', cache_control: { type: 'ephemeral', ttl: '5m' } }] }] };
    await anthropic.messages.create(req);
    const stats = await (await fetch(`${server.url}/stats`)).json();
    assert.ok(stats.prompt_cache.sessions >= 1, `prompt_cache: ${JSON.stringify(stats.prompt_cache)}`);
    const repeat = await anthropic.messages.create(req);
    assert.ok(repeat.usage.cache_read_input_tokens > 0, JSON.stringify(repeat.usage));
  });
});

describe('errors and keys', () => {
  test('bad input is a BadRequestError of type invalid_request_error naming the field', async () => {
    await assert.rejects(anthropic.messages.create({ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }] }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, `${e.constructor.name}: ${e.message}`);
      assert.equal(e.status, 400);
      assert.equal(e.type, 'invalid_request_error');
      assert.match(e.message, /messages\[0\]\.content\[0\]\.type.*not supported by this model/);
      return true;
    });
    await assert.rejects(anthropic.messages.create({ model: modelId, max_tokens: 0, messages: hello }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError);
      assert.match(e.message, /max_tokens/);
      return true;
    });
    await assert.rejects(anthropic.messages.create({ model: modelId, messages: hello }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError);
      assert.match(e.message, /max_tokens/);
      return true;
    });
  });

  test('with --api-key: a wrong key is an AuthenticationError (401); x-api-key and Bearer with the right key work', async () => {
    const s = await startServer(['--api-key', 'sk-ant-e2e'], { name: 'anthropic-key' });
    try {
      await assert.rejects(sdk(s.url, { apiKey: 'sk-wrong' }).messages.create({ model: modelId, max_tokens: 2, messages: hello }), (e) => {
        assert.ok(e instanceof Anthropic.AuthenticationError, `${e.constructor.name}: ${e.message}`);
        assert.equal(e.status, 401);
        assert.equal(e.type, 'authentication_error');
        return true;
      });
      await assert.rejects(sdk(s.url, { apiKey: 'sk-wrong' }).messages.countTokens({ model: modelId, messages: hello }), Anthropic.AuthenticationError);
      const m = await sdk(s.url, { apiKey: 'sk-ant-e2e' }).messages.create({ model: modelId, max_tokens: 2, messages: hello });
      assert.equal(m.type, 'message');
      const bearer = await sdk(s.url, { authToken: 'sk-ant-e2e' }).messages.create({ model: modelId, max_tokens: 2, messages: hello });
      assert.equal(bearer.type, 'message');
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--api-key server exit ${JSON.stringify(r)}`);
    }
  });
});
