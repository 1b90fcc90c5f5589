// tests/e2e/e2e.test.mjs — inferd serve through the official openai SDK (v6): chat, completions, stop strings, seeds, logprobs, usage, typed errors.
//
// The test model has random weights, so its text is arbitrary; what is checked is the protocol
// and the properties that hold for any model (greedy determinism, stop-string cuts, usage sums).
import { execFileSync } from 'node:child_process';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import {
  binary, client, hello, metrics, metricSum, modelDir, modelId, sleep, slow, smallChat, sseRequest, startServer, useMainServer } from './lib/harness.mjs';

let server;
let openai;

useMainServer((s, c) => {
  server = s;
  openai = c;
});

const greedy = { model: modelId, temperature: 0 };

/* A greedy chat request's content and the bytes of each generated token (from logprobs). */
async function greedyTokens(messages, maxTokens) {
  const r = await openai.chat.completions.create({ ...greedy, messages, max_tokens: maxTokens, logprobs: true });
  const c = r.choices[0];
  const tokens = c.logprobs.content.map((e) => Buffer.from(e.bytes));
  return { content: c.message.content ?? '', tokens, response: r };
}

/* A stop string of a few bytes that straddles the boundary between two generated tokens and
 * whose first occurrence in the text is at that boundary; null when the text has none. */
function straddlingStop(text, tokens) {
  const all = Buffer.from(text, 'utf8');
  if (!Buffer.concat(tokens).equals(all)) return null;
  const validUtf8 = (b) => Buffer.from(b.toString('utf8'), 'utf8').equals(b) && !b.toString('utf8').includes('\uFFFD');
  let boundary = 0;
  for (let i = 0; i + 1 < tokens.length; i++) {
    boundary += tokens[i].length;
    for (const [a, b] of [[2, 2], [1, 2], [2, 1], [1, 1], [3, 3], [4, 4]]) {
      if (a > tokens[i].length || b > tokens[i + 1].length) continue;
      const s = all.subarray(boundary - a, boundary + b);
      if (!validUtf8(s) || s.toString('utf8').trim() === '') continue;
      if (all.indexOf(s) !== boundary - a) continue;
      return { stop: s.toString('utf8'), expected: all.subarray(0, boundary - a).toString('utf8'), tokenIndex: i };
    }
  }
  return null;
}

describe('chat completions', () => {
  test('non-streaming chat returns a chat.completion with an assistant message and usage', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 8 });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.equal(typeof r.created, 'number');
    assert.ok(Math.abs(r.created - Date.now() / 1000) < 600, `created ${r.created} is not a current unix time in seconds`);
    assert.equal(typeof r.model, 'string');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
    assert.equal(c.logprobs ?? null, null);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    assert.equal(typeof r.usage.prompt_tokens_details?.cached_tokens, 'number');
  });

  test('streaming chat: role first, content deltas, finish_reason, and the SDK ends on [DONE]', async () => {
    const stream = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 12, stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.ok(chunks.length >= 2, `${chunks.length} chunks`);
    const id = chunks[0].id;
    for (const ch of chunks) {
      assert.equal(ch.object, 'chat.completion.chunk');
      assert.equal(ch.id, id, 'every chunk carries the same id');
      assert.match(ch.id, /^chatcmpl-/);
      assert.equal(typeof ch.created, 'number');
      assert.equal(ch.choices.length, 1, 'no usage chunk without include_usage');
      assert.equal(ch.choices[0].index, 0);
    }
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const finals = chunks.filter((ch) => ch.choices[0].finish_reason);
    assert.equal(finals.length, 1, 'exactly one chunk has a finish_reason');
    assert.equal(finals[0], chunks.at(-1), 'the finish_reason chunk is the last');
    assert.ok(['stop', 'length'].includes(finals[0].choices[0].finish_reason));
    const streamed = chunks.map((ch) => ch.choices[0].delta.content ?? '').join('');
    const whole = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 12 });
    assert.equal(streamed, whole.choices[0].message.content ?? '', 'greedy stream and non-stream agree');
    assert.equal(finals[0].choices[0].finish_reason, whole.choices[0].finish_reason);
  });

  test('the raw SSE stream is data: lines ending in data: [DONE], with usage when include_usage', async () => {
    const r = await sseRequest(server.url, '/v1/chat/completions', { ...greedy, messages: hello, max_tokens: 6, stream: true, stream_options: { include_usage: true } });
    assert.equal(r.status, 200, r.raw);
    assert.match(r.headers.get('content-type') || '', /^text\/event-stream/);
    assert.ok(r.done, `stream does not end with data: [DONE]: ${JSON.stringify(r.raw.slice(-200))}`);
    assert.ok(r.raw.endsWith('data: [DONE]\n\n'), `stream tail ${JSON.stringify(r.raw.slice(-40))}`);
    assert.deepEqual(r.chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    const usageChunk = r.chunks.at(-1);
    assert.deepEqual(usageChunk.choices, []);
    const u = usageChunk.usage;
    assert.ok(u && u.completion_tokens > 0 && u.completion_tokens <= 6, JSON.stringify(u));
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    for (const ch of r.chunks.slice(0, -1)) assert.ok(ch.usage === undefined || ch.usage === null, 'usage only on the last chunk');
  });

  test('stream usage through the SDK matches the non-streaming usage', async () => {
    const stream = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 5, stream: true, stream_options: { include_usage: true } });
    let usage = null;
    let n = 0;
    for await (const ch of stream) {
      n++;
      if (ch.usage) usage = ch.usage;
    }
    const whole = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 5 });
    assert.ok(n > 1);
    assert.deepEqual(
      { p: usage.prompt_tokens, c: usage.completion_tokens, t: usage.total_tokens },
      { p: whole.usage.prompt_tokens, c: whole.usage.completion_tokens, t: whole.usage.total_tokens },
    );
  });

  test('max_tokens and max_completion_tokens end with finish_reason length at exactly that many tokens', async () => {
    for (const field of ['max_tokens', 'max_completion_tokens']) {
      const r = await openai.chat.completions.create({ ...greedy, messages: hello, [field]: 7 });
      assert.equal(r.choices[0].finish_reason, 'length', `${field}: ${JSON.stringify(r.choices[0])}`);
      assert.equal(r.usage.completion_tokens, 7, field);
    }
    const stream = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 7, stream: true, stream_options: { include_usage: true } });
    let finish = null;
    let usage = null;
    for await (const ch of stream) {
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 7);
  });

  const toolConversation = (assistantContent) => ({
    ...greedy,
    max_tokens: 4,
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'developer', content: 'Answer in one word.' },
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: assistantContent, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 12}' },
      { role: 'user', content: 'And now?' },
    ],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather by city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
    tool_choice: 'auto',
    chat_template_kwargs: { enable_thinking: false },
    reasoning_effort: 'low',
    user: 'e2e',
  });

  test('system, developer, assistant (with tool_calls) and tool messages, tools and chat_template_kwargs are accepted', async () => {
    const r = await openai.chat.completions.create(toolConversation(''));
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(r.usage.completion_tokens > 0);
  });

  test('an assistant tool-call message with content null (as the API returns it) is accepted like content ""', async () => {
    const r = await openai.chat.completions.create(toolConversation(null));
    const e = await openai.chat.completions.create(toolConversation(''));
    assert.equal(r.usage.prompt_tokens, e.usage.prompt_tokens);
  });

  test('content as an array of text parts is accepted and equals the same text as a string', async () => {
    // One part per message: how several parts are joined ("" or "\n") differs between servers.
    const parts = await openai.chat.completions.create({ ...greedy, max_tokens: 6, messages: [{ role: 'system', content: [{ type: 'text', text: 'Be brief.' }] }, { role: 'user', content: [{ type: 'text', text: 'Say hello.' }] }] });
    const plain = await openai.chat.completions.create({ ...greedy, max_tokens: 6, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello.' }] });
    assert.equal(parts.usage.prompt_tokens, plain.usage.prompt_tokens);
    assert.equal(parts.choices[0].message.content, plain.choices[0].message.content);
  });

  test('tools are rendered into the prompt (more prompt tokens with them than without)', async () => {
    const base = { ...greedy, max_tokens: 1, messages: hello };
    const plain = await openai.chat.completions.create(base);
    const withTools = await openai.chat.completions.create({ ...base, tools: [{ type: 'function', function: { name: 'lookup', description: 'Looks a word up', parameters: { type: 'object', properties: { word: { type: 'string' } } } } }] });
    assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 10, `${withTools.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
  });

  test('chat_template_kwargs reach the template (Qwen3: enable_thinking false adds an empty think block)', async () => {
    const base = { ...greedy, max_tokens: 1, messages: hello };
    const plain = await openai.chat.completions.create(base);
    const noThinking = await openai.chat.completions.create({ ...base, chat_template_kwargs: { enable_thinking: false } });
    assert.ok(noThinking.usage.prompt_tokens > plain.usage.prompt_tokens, `${noThinking.usage.prompt_tokens} vs ${plain.usage.prompt_tokens} prompt tokens`);
  });

  test('the model field is accepted with any value', async () => {
    const r = await openai.chat.completions.create({ model: 'gpt-4o', temperature: 0, messages: hello, max_tokens: 2 });
    assert.equal(r.object, 'chat.completion');
  });
});

describe('completions', () => {
  test('string prompt, non-streaming: a text_completion with text and usage', async () => {
    const r = await openai.completions.create({ ...greedy, prompt: 'The capital of France is', max_tokens: 6 });
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(typeof r.choices[0].text, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.equal(r.choices[0].logprobs ?? null, null);
    assert.ok(r.usage.prompt_tokens >= 4 && r.usage.prompt_tokens <= 8, `prompt_tokens ${r.usage.prompt_tokens} for a 5-word prompt`);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test('token-id prompt: prompt_tokens is the number of ids', async () => {
    const ids = [785, 6722, 315, 9625, 374];
    const r = await openai.completions.create({ ...greedy, prompt: ids, max_tokens: 5 });
    assert.equal(r.usage.prompt_tokens, ids.length);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 5);
  });

  test('a token-id prompt equal to the string prompt\'s tokens generates the same text', async () => {
    // "The capital of France is" in Qwen3's tokenizer.
    const a = await openai.completions.create({ ...greedy, prompt: 'The capital of France is', max_tokens: 8 });
    const b = await openai.completions.create({ ...greedy, prompt: [785, 6722, 315, 9625, 374], max_tokens: 8 });
    assert.equal(a.usage.prompt_tokens, 5);
    assert.equal(b.choices[0].text, a.choices[0].text);
  });

  test('streaming completions: text deltas concatenate to the non-streaming text, then [DONE]', async () => {
    for (const prompt of ['Once upon a time', [12522, 5193, 264, 882]]) {
      const stream = await openai.completions.create({ ...greedy, prompt, max_tokens: 10, stream: true, stream_options: { include_usage: true } });
      let text = '';
      let finish = null;
      let usage = null;
      for await (const ch of stream) {
        assert.equal(ch.object, 'text_completion');
        if (ch.choices.length) {
          text += ch.choices[0].text;
          if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
        }
        if (ch.usage) usage = ch.usage;
      }
      const whole = await openai.completions.create({ ...greedy, prompt, max_tokens: 10 });
      assert.equal(text, whole.choices[0].text, `prompt ${JSON.stringify(prompt)}`);
      assert.equal(finish, whole.choices[0].finish_reason);
      assert.equal(usage?.completion_tokens, whole.usage.completion_tokens);
      assert.equal(usage?.prompt_tokens, whole.usage.prompt_tokens);
    }
    const raw = await sseRequest(server.url, '/v1/completions', { ...greedy, prompt: 'Hi', max_tokens: 3, stream: true });
    assert.equal(raw.status, 200);
    assert.ok(raw.done, `no [DONE]: ${JSON.stringify(raw.raw.slice(-200))}`);
  });

  test('completions logprobs: tokens, token_logprobs, top_logprobs and text_offset line up', async () => {
    const prompt = 'The capital of France is';
    const r = await openai.completions.create({ ...greedy, prompt, max_tokens: 6, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.ok(lp, 'logprobs missing');
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.top_logprobs.length, lp.tokens.length);
    assert.equal(lp.text_offset.length, lp.tokens.length);
    // A token that ends inside a multi-byte character has no exact text of its own.
    const whole = lp.tokens.every((t) => !t.includes('\uFFFD') && !t.startsWith('bytes:'));
    if (whole) assert.equal(lp.tokens.join(''), r.choices[0].text, 'tokens concatenate to the text');
    const chars = (str) => [...str].length; // text_offset counts characters (code points)
    for (let i = 0; i < lp.tokens.length; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const top = Object.entries(lp.top_logprobs[i]);
      assert.ok(top.length >= 1 && top.length <= 3, `top_logprobs[${i}] has ${top.length}`);
      const best = Math.max(...top.map(([, v]) => v));
      assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-4, 'greedy picks the top token');
      if (i > 0 && whole) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + chars(lp.tokens[i - 1]), `text_offset[${i}]`);
      if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1], 'text_offset never decreases');
    }
  });
});

describe('stop strings', () => {
  test('a stop string straddling two tokens ends the output right before it (finish_reason stop)', async (t) => {
    const messages = [{ role: 'user', content: 'Write a long story about a lighthouse.' }];
    const g = await greedyTokens(messages, 24);
    const pick = straddlingStop(g.content, g.tokens);
    assert.ok(pick, `no stop string straddling a token boundary in ${JSON.stringify(g.content)} (tokens ${JSON.stringify(g.tokens.map((b) => b.toString('utf8')))}); logprob bytes must concatenate to the content`);
    t.diagnostic(`greedy text ${JSON.stringify(g.content)}; stop ${JSON.stringify(pick.stop)} across tokens ${pick.tokenIndex}/${pick.tokenIndex + 1}`);
    const r = await openai.chat.completions.create({ ...greedy, messages, max_tokens: 24, stop: pick.stop });
    assert.equal(r.choices[0].message.content, pick.expected);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(!r.choices[0].message.content.includes(pick.stop));

    const list = await openai.chat.completions.create({ ...greedy, messages, max_tokens: 24, stop: ['@@never@@', pick.stop, 'zzzzqqq', '\u0007\u0001'] });
    assert.equal(list.choices[0].message.content, pick.expected, 'a list of stop strings');
    assert.equal(list.choices[0].finish_reason, 'stop');

    const stream = await openai.chat.completions.create({ ...greedy, messages, max_tokens: 24, stop: pick.stop, stream: true });
    let text = '';
    let finish = null;
    for await (const ch of stream) {
      text += ch.choices[0]?.delta?.content ?? '';
      assert.ok(!text.includes(pick.stop), `streamed past the stop string: ${JSON.stringify(text)}`);
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    }
    assert.equal(text, pick.expected);
    assert.equal(finish, 'stop');
  });

  test('completions honour stop strings too, streaming and not', async () => {
    const prompt = 'Tell me about rivers.';
    const r0 = await openai.completions.create({ ...greedy, prompt, max_tokens: 24, logprobs: 0 });
    const text0 = r0.choices[0].text;
    const tokens = r0.choices[0].logprobs.tokens.map((s) => Buffer.from(s, 'utf8'));
    // Straddling is proven on chat above; here any short string from the middle will do when
    // the token texts do not add up (a token ending inside a multi-byte character).
    let pick = straddlingStop(text0, tokens);
    if (!pick) {
      const cps = [...text0];
      for (let i = Math.floor(cps.length / 2); i + 3 <= cps.length && !pick; i++) {
        const stop = cps.slice(i, i + 3).join('');
        if (stop.trim() !== '' && !stop.includes('\uFFFD')) pick = { stop, expected: text0.slice(0, text0.indexOf(stop)) };
      }
    }
    assert.ok(pick, `no usable stop string in ${JSON.stringify(text0)}`);
    const r = await openai.completions.create({ ...greedy, prompt, max_tokens: 24, stop: [pick.stop] });
    assert.equal(r.choices[0].text, pick.expected);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const stream = await openai.completions.create({ ...greedy, prompt, max_tokens: 24, stop: pick.stop, stream: true });
    let text = '';
    for await (const ch of stream) {
      text += ch.choices[0]?.text ?? '';
      assert.ok(!text.includes(pick.stop));
    }
    assert.equal(text, pick.expected);
  });

  test('a stop string that never appears leaves finish_reason length', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 6, stop: ['\u0007never\u0007'] });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 6);
  });
});

describe('sampling', () => {
  const req = { model: modelId, messages: [{ role: 'user', content: 'Pick random words.' }], temperature: 1, max_tokens: 16 };

  test('the same seed twice gives the same output; other seeds give different ones', async () => {
    const a = await openai.chat.completions.create({ ...req, seed: 42 });
    const b = await openai.chat.completions.create({ ...req, seed: 42 });
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    const others = [];
    for (const seed of [43, 44, 45]) others.push((await openai.chat.completions.create({ ...req, seed })).choices[0].message.content);
    assert.ok(others.some((o) => o !== a.choices[0].message.content), `seeds 42..45 all gave ${JSON.stringify(a.choices[0].message.content)}`);
    const s1 = await openai.chat.completions.create({ ...req, seed: 42, stream: true });
    let streamed = '';
    for await (const ch of s1) streamed += ch.choices[0]?.delta?.content ?? '';
    assert.equal(streamed, a.choices[0].message.content, 'streaming with the same seed gives the same text');
  });

  test('sampling parameters in range are accepted', async () => {
    const r = await openai.chat.completions.create({
      ...req, seed: 7, n: 1, top_p: 0.9, top_k: 20, min_p: 0.05, repetition_penalty: 1.1, presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: { 100: 5, 200: -100 }, max_tokens: 4,
    });
    assert.ok(r.usage.completion_tokens > 0);
  });

  test('logit_bias +100 on one token makes the greedy output that token', async () => {
    const target = 9707; // "Hello"
    const r = await openai.completions.create({ ...greedy, prompt: 'x', max_tokens: 3, logit_bias: { [target]: 100 }, logprobs: 0 });
    assert.deepEqual(r.choices[0].logprobs.tokens, ['Hello', 'Hello', 'Hello']);
  });
});

describe('logprobs', () => {
  test('chat logprobs: one entry per token with token, logprob, bytes and top_logprobs sorted best first', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 8, logprobs: true, top_logprobs: 5 });
    const content = r.choices[0].logprobs?.content;
    assert.ok(Array.isArray(content), JSON.stringify(r.choices[0].logprobs));
    assert.equal(content.length, r.usage.completion_tokens);
    assert.equal(Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString('utf8'), r.choices[0].message.content, 'bytes concatenate to the content');
    for (const e of content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
      assert.ok(e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b <= 255));
      assert.equal(e.top_logprobs.length, 5);
      for (let i = 1; i < 5; i++) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob, 'top_logprobs sorted descending');
      for (const t of e.top_logprobs) {
        assert.equal(typeof t.token, 'string');
        assert.ok(Array.isArray(t.bytes));
        assert.ok(t.logprob <= 0);
      }
      assert.equal(e.top_logprobs[0].token, e.token, 'greedy: the chosen token is the most likely');
      assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4);
      assert.equal(new Set(e.top_logprobs.map((t) => t.token + '\u0000' + t.bytes.join(','))).size, 5, 'distinct alternatives');
    }
  });

  test('top_logprobs 0 gives empty lists; logprobs absent gives null', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 3, logprobs: true, top_logprobs: 0 });
    for (const e of r.choices[0].logprobs.content) assert.deepEqual(e.top_logprobs, []);
    const n = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 3 });
    assert.equal(n.choices[0].logprobs ?? null, null);
  });

  test('streamed chunks carry the logprobs of their tokens', async () => {
    const stream = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 6, logprobs: true, top_logprobs: 2, stream: true, stream_options: { include_usage: true } });
    let n = 0;
    let usage = null;
    for await (const ch of stream) {
      for (const e of ch.choices[0]?.logprobs?.content ?? []) {
        assert.equal(e.top_logprobs.length, 2);
        n++;
      }
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(n, usage.completion_tokens);
  });

  test('top_logprobs 21 and top_logprobs without logprobs are 400s', async () => {
    await assert.rejects(openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 2, logprobs: true, top_logprobs: 21 }), OpenAI.BadRequestError);
    await assert.rejects(openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 2, top_logprobs: 3 }), OpenAI.BadRequestError);
  });
});

describe('models, health, stats and metrics', () => {
  test('client.models.list() lists the served model and retrieve() finds it', async () => {
    const page = await openai.models.list();
    const ids = [];
    for await (const m of page) {
      assert.equal(m.object, 'model');
      assert.equal(typeof m.created, 'number');
      assert.equal(typeof m.owned_by, 'string');
      ids.push(m.id);
    }
    assert.deepEqual(ids, [modelId]);
    const m = await openai.models.retrieve(modelId);
    assert.equal(m.id, modelId);
    assert.equal(m.object, 'model');
  });

  test('retrieving an unknown model is a NotFoundError', async () => {
    await assert.rejects(openai.models.retrieve('no-such-model'), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  });

  test('response_format json_object/json_schema is enforced with no Warning header; text asks for nothing', async () => {
    const ask = (format) => fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...greedy, max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }], response_format: format }),
    });
    for (const format of [{ type: 'json_object' }, { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } }]) {
      const r = await ask(format);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('warning'), null);
      const body = await r.json();
      assert.ok(body.choices[0].finish_reason === 'length' || JSON.parse(body.choices[0].message.content));
    }
    const plain = await ask({ type: 'text' });
    assert.equal(plain.status, 200);
    assert.equal(plain.headers.get('warning'), null);
    await plain.json();
  });

  test('GET /health is {"status":"ok"}', async () => {
    const r = await fetch(`${server.url}/health`);
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { status: 'ok' });
  });

  test('GET /stats is JSON naming the model, uptime, requests and tokens', async () => {
    const r = await fetch(`${server.url}/stats`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type') || '', /application\/json/);
    const s = await r.json();
    const text = JSON.stringify(s);
    assert.ok(text.includes(modelId), `model id missing from ${text}`);
    assert.equal(typeof s.uptime_s, 'number', text);
    for (const key of ['requests', 'tokens', 'queue']) assert.ok(text.includes(key), `no "${key}" in ${text}`);
  });

  test('GET /metrics exposes the request counter, token counters, latency histograms and queue depth', async () => {
    await smallChat(server.url);
    const r = await fetch(`${server.url}/metrics`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type') || '', /^text\/plain/);
    const text = await r.text();
    for (const name of ['inferd_requests_total', 'inferd_prompt_tokens_total', 'inferd_generated_tokens_total', 'inferd_queue_depth']) {
      assert.match(text, new RegExp(`^# TYPE ${name} (counter|gauge)$`, 'm'), `${name} TYPE line`);
    }
    for (const h of ['inferd_time_to_first_token_seconds', 'inferd_inter_token_latency_seconds', 'inferd_request_queue_time_seconds', 'inferd_request_prefill_time_seconds']) {
      assert.match(text, new RegExp(`^# TYPE ${h} histogram$`, 'm'));
      assert.match(text, new RegExp(`^${h}_bucket\\{le="\\+Inf"\\} \\d+`, 'm'));
      assert.match(text, new RegExp(`^${h}_sum `, 'm'));
      assert.match(text, new RegExp(`^${h}_count `, 'm'));
    }
    assert.match(text, /^inferd_requests_total\{[^}]*route="\/v1\/chat\/completions"[^}]*status="200"[^}]*\} \d+/m);
    const m = await metrics(server.url);
    assert.ok(metricSum(m, 'inferd_generated_tokens_total') > 0);
    assert.ok(metricSum(m, 'inferd_prompt_tokens_total') > 0);
  });

  test('histograms are cumulative: bucket counts never decrease and le="+Inf" equals _count', async () => {
    await smallChat(server.url);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (const h of ['inferd_time_to_first_token_seconds', 'inferd_inter_token_latency_seconds', 'inferd_request_queue_time_seconds', 'inferd_request_prefill_time_seconds']) {
      const buckets = [...text.matchAll(new RegExp(`^${h}_bucket\\{le="([^"]+)"\\} (\\S+)$`, 'gm'))].map((m) => [m[1] === '+Inf' ? Infinity : Number(m[1]), Number(m[2])]);
      assert.ok(buckets.length >= 2, `${h}: ${buckets.length} buckets`);
      for (let i = 1; i < buckets.length; i++) {
        assert.ok(buckets[i][0] > buckets[i - 1][0], `${h}: le bounds increase`);
        assert.ok(buckets[i][1] >= buckets[i - 1][1], `${h}: bucket counts are cumulative`);
      }
      assert.equal(buckets.at(-1)[0], Infinity);
      const count = Number(new RegExp(`^${h}_count (\\S+)$`, 'm').exec(text)[1]);
      assert.equal(buckets.at(-1)[1], count, `${h}: le="+Inf" equals _count`);
      assert.ok(count > 0);
    }
  });

  test('refused requests are counted under their route and status', async () => {
    const key = 'inferd_requests_total{route="/v1/chat/completions",status="400"}';
    const before = (await metrics(server.url)).get(key) || 0;
    await assert.rejects(openai.chat.completions.create({ model: modelId, messages: [], max_tokens: 2 }), OpenAI.BadRequestError);
    const afterM = await metrics(server.url);
    assert.equal((afterM.get(key) || 0) - before, 1, key);
  });

  test('a completed request moves the token counters by its usage', async () => {
    const before = await metrics(server.url);
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 9 });
    await sleep(50);
    const afterM = await metrics(server.url);
    assert.equal(metricSum(afterM, 'inferd_generated_tokens_total') - metricSum(before, 'inferd_generated_tokens_total'), r.usage.completion_tokens);
    assert.equal(metricSum(afterM, 'inferd_prompt_tokens_total') - metricSum(before, 'inferd_prompt_tokens_total'), r.usage.prompt_tokens);
  });
});

describe('errors as the SDK\'s typed errors', () => {
  const bad = async (body, param) => {
    await assert.rejects(openai.chat.completions.create({ model: modelId, messages: hello, max_tokens: 2, ...body }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status} ${e?.message}`);
      assert.equal(e.status, 400);
      assert.equal(typeof e.error?.message, 'string');
      assert.equal(typeof e.type, 'string');
      if (param) assert.equal(e.param, param, `param for ${JSON.stringify(body)}`);
      return true;
    });
  };

  test('temperature 3 is a BadRequestError naming temperature', () => bad({ temperature: 3 }, 'temperature'));
  test('empty messages is a BadRequestError', () => bad({ messages: [] }, 'messages'));
  test('n = 2 is a BadRequestError', () => bad({ n: 2 }, 'n'));
  test('negative max_tokens is a BadRequestError', () => bad({ max_tokens: -1 }, 'max_tokens'));
  test('top_p 1.5 is a BadRequestError', () => bad({ top_p: 1.5 }, 'top_p'));
  test('an unknown role is a BadRequestError', () => bad({ messages: [{ role: 'wizard', content: 'hi' }] }));
  test('a wrongly typed field is a BadRequestError', () => bad({ temperature: 'hot' }, 'temperature'));
  test('more than 4 stop strings is a BadRequestError', () => bad({ stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'));

  test('an unknown route is a 404 with an OpenAI error object (raw fetch and SDK)', async () => {
    const r = await fetch(`${server.url}/v1/no-such-route`);
    assert.equal(r.status, 404);
    const body = await r.json();
    assert.equal(typeof body.error?.message, 'string');
    await assert.rejects(openai.get('/no-such-route'), OpenAI.NotFoundError);
    await assert.rejects(openai.post('/chat/completions/extra', { body: {} }), OpenAI.NotFoundError);
  });

  test('a prompt longer than the context is a 400 naming both numbers', async () => {
    const ctx = 64;
    const s = await startServer(['--ctx', String(ctx)], { name: 'ctx64' });
    try {
      const c = client(s.url);
      const ids = Array.from({ length: 100 }, (_, i) => 1000 + i);
      await assert.rejects(c.completions.create({ model: modelId, prompt: ids, max_tokens: 4 }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status} ${e?.message}`);
        assert.match(e.error.message, /\b100\b/, `message names the prompt's 100 tokens: ${e.error.message}`);
        assert.match(e.error.message, /\b64\b/, `message names the context of 64: ${e.error.message}`);
        return true;
      });
      await assert.rejects(c.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: 'word '.repeat(200) }], max_tokens: 4 }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status}`);
        assert.match(e.error.message, /\b64\b/, e.error.message);
        const nums = (e.error.message.match(/\d+/g) || []).map(Number);
        assert.ok(nums.some((n) => n > 200), `message names the prompt length: ${e.error.message}`);
        return true;
      });
      const ok = await c.completions.create({ model: modelId, prompt: ids.slice(0, 10), max_tokens: 4 });
      assert.equal(ok.usage.prompt_tokens, 10, 'a prompt that fits still works');
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--ctx server exit ${JSON.stringify(r)}`);
    }
  });

  test('--stream-interval: a long window sends the first token alone and the rest with the finish; 0 sends every step; the text is the same', async () => {
    const body = { ...greedy, messages: hello, max_tokens: 24, stream: true, stream_options: { include_usage: true } };
    const texts = {};
    for (const ms of ['0', '1000']) {
      const s = await startServer(['--stream-interval', ms], { name: `interval${ms}` });
      try {
        const chunks = [];
        for await (const ch of await client(s.url).chat.completions.create(body)) chunks.push(ch);
        const content = chunks.filter((ch) => ch.choices[0]?.delta?.content);
        const tokens = chunks.at(-1).usage.completion_tokens;
        texts[ms] = content.map((ch) => ch.choices[0].delta.content).join('');
        if (ms === '1000')
          assert.ok(content.length < tokens, `${content.length} content chunks for ${tokens} tokens: the window's tokens came together`);
        else
          assert.ok(content.length > tokens / 2, `${content.length} content chunks for ${tokens} tokens at --stream-interval 0`);
      } finally {
        const r = await s.stop();
        assert.equal(r.code, 0, `--stream-interval ${ms} server exit ${JSON.stringify(r)}`);
      }
    }
    assert.equal(texts['1000'], texts['0'], 'the same greedy text either way');
  });

  test('with --api-key: a wrong or missing key is an AuthenticationError (401), the right key works', async () => {
    const s = await startServer(['--api-key', 'sk-e2e-secret'], { name: 'apikey' });
    try {
      await assert.rejects(client(s.url, { apiKey: 'sk-wrong' }).chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 }), (e) => {
        assert.ok(e instanceof OpenAI.AuthenticationError, `${e?.constructor?.name} ${e?.status}`);
        assert.equal(e.status, 401);
        assert.equal(typeof e.error?.message, 'string');
        return true;
      });
      await assert.rejects(client(s.url, { apiKey: 'sk-wrong' }).models.list(), OpenAI.AuthenticationError);
      const none = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: modelId, messages: hello, max_tokens: 2 }) });
      assert.equal(none.status, 401, 'no Authorization header');
      assert.equal(typeof (await none.json()).error?.message, 'string');
      const basic = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Basic c2stZTJlLXNlY3JldA==' }, body: JSON.stringify({ model: modelId, messages: hello, max_tokens: 2 }) });
      assert.equal(basic.status, 401, 'Basic instead of Bearer');
      const r = await client(s.url, { apiKey: 'sk-e2e-secret' }).chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 });
      assert.equal(r.object, 'chat.completion');
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--api-key server exit ${JSON.stringify(r)}`);
    }
  });

  test('with --max-queue 1: a burst of concurrent requests gets RateLimitErrors (429), the rest succeed', async (t) => {
    const s = await startServer(['--max-queue', '1', '--max-batch', '1'], { name: 'queue1' });
    try {
      const c = client(s.url);
      const results = await Promise.allSettled(Array.from({ length: 12 }, () => c.chat.completions.create({ model: modelId, messages: hello, max_tokens: 16, temperature: 0 })));
      const limited = results.filter((r) => r.status === 'rejected' && r.reason instanceof OpenAI.RateLimitError);
      const ok = results.filter((r) => r.status === 'fulfilled');
      const other = results.filter((r) => r.status === 'rejected' && !(r.reason instanceof OpenAI.RateLimitError));
      assert.deepEqual(other.map((r) => `${r.reason?.constructor?.name} ${r.reason?.status} ${r.reason?.message}`), [], 'only 429s may fail');
      t.diagnostic(`12 concurrent requests: ${ok.length} served, ${limited.length} refused with 429`);
      assert.ok(limited.length >= 1, `no 429 among 12 concurrent requests (${ok.length} succeeded)`);
      assert.ok(ok.length >= 1, 'at least one request is served');
      assert.equal(limited[0].reason.status, 429);
      assert.equal(typeof limited[0].reason.error?.message, 'string');
      await smallChat(s.url);
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--max-queue server exit ${JSON.stringify(r)}`);
    }
  });
});

describe('server lifecycle', () => {
  test('SIGTERM during a streaming request (--shutdown-timeout 2): new connections are refused, the stream ends, exit 0 within 10 s', { timeout: 60000 * slow }, async (t) => {
    const s = await startServer(['--shutdown-timeout', '2'], { name: 'sigterm' });
    const c = client(s.url);
    const stream = await c.chat.completions.create({ model: modelId, messages: hello, max_tokens: 1500, temperature: 0, stream: true });
    const reading = (async () => {
      let n = 0;
      try {
        for await (const ch of stream) n += ch.choices.length;
      } catch {
        /* the stream may be cut */
      }
      return n;
    })();
    await sleep(300);
    const stopping = s.stop();
    await sleep(200);
    const late = await fetch(`${s.url}/health`).then((r) => r.status, (e) => String(e.cause?.code || e));
    const r = await stopping;
    const chunks = await reading;
    t.diagnostic(`exit ${JSON.stringify(r)}; /health 0.2 s after SIGTERM: ${late}; ${chunks} chunks streamed`);
    assert.equal(r.hung, undefined, `did not exit within 10 s of SIGTERM`);
    assert.equal(r.code, 0, `exit ${JSON.stringify(r)}`);
    assert.ok(late !== 200, `GET /health still answered 200 while shutting down (want 503 or a refused connection)`);
  });

  test('SIGINT on an idle server: exit 0 within 10 s', async () => {
    const s = await startServer([], { name: 'sigint' });
    await smallChat(s.url);
    const t0 = Date.now();
    s.proc.kill('SIGINT');
    const r = await s.stop();
    assert.equal(r.code, 0, `exit ${JSON.stringify(r)}`);
    assert.ok(Date.now() - t0 < 10000);
  });
});

/* A system prompt of several KV blocks, so a prefix cache has whole blocks to reuse. */
const longSystem = Array.from({ length: 12 }, (_, i) => `Rule ${i + 1}: answer briefly and politely, in plain words.`).join(' ');
const tenantChat = [{ role: 'system', content: longSystem }, { role: 'user', content: 'Say hello.' }];

describe('tenants, budgets and /fit', () => {
  test('with --api-key and --api-keys FILE: every listed key works, another is 401; tenants never share cached prompts', async (t) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-keys-'));
    const file = path.join(dir, 'keys.txt');
    fs.writeFileSync(file, '# tenants\n\nsk-tenant-b\n  sk-tenant-c  \n');
    const s = await startServer(['--api-key', 'sk-tenant-a', '--api-keys', file], { name: 'apikeys' });
    try {
      // Isolation first: a tenant's own earlier requests (even their first token, the chat
      // template's) are its to reuse, so tenant b asks nothing before this.
      const a = client(s.url, { apiKey: 'sk-tenant-a' });
      const b = client(s.url, { apiKey: 'sk-tenant-b' });
      const ask = (c) => c.chat.completions.create({ ...greedy, messages: tenantChat, max_tokens: 4 });
      const first = await ask(a);
      const repeat = await ask(a);
      const other = await ask(b);
      const cached = (r) => r.usage.prompt_tokens_details?.cached_tokens;
      t.diagnostic(`cached_tokens: tenant a ${cached(first)} then ${cached(repeat)} of ${repeat.usage.prompt_tokens}; tenant b ${cached(other)}`);
      assert.equal(cached(other), 0, "the second tenant reuses none of the first tenant's prompt");
      for (const key of ['sk-tenant-a', 'sk-tenant-b', 'sk-tenant-c']) {
        const r = await client(s.url, { apiKey: key }).chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 });
        assert.equal(r.object, 'chat.completion', `key ${key}`);
      }
      await assert.rejects(client(s.url, { apiKey: 'sk-tenant-d' }).chat.completions.create({ model: modelId, messages: hello, max_tokens: 2 }), (e) => {
        assert.ok(e instanceof OpenAI.AuthenticationError, `${e?.constructor?.name} ${e?.status}`);
        assert.equal(e.status, 401);
        return true;
      });
      const xkey = await fetch(`${s.url}/v1/models`, { headers: { 'x-api-key': 'sk-tenant-c' } });
      assert.equal(xkey.status, 200, 'x-api-key carries a listed key too');

      assert.ok(cached(repeat) > 0, 'the first tenant hits its own cached prompt on a repeat');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
      const r = await s.stop();
      assert.equal(r.code, 0, `--api-keys server exit ${JSON.stringify(r)}`);
    }
  });

  test('--api-keys with a missing or keyless file is a startup error', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-keys-'));
    try {
      await assert.rejects(startServer(['--api-keys', path.join(dir, 'missing.txt')], { name: 'apikeys-missing' }), /exited \(code [1-9]/);
      const empty = path.join(dir, 'empty.txt');
      fs.writeFileSync(empty, '# nothing\n\n');
      await assert.rejects(startServer(['--api-keys', empty], { name: 'apikeys-empty' }), /holds no key/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('cache_salt, session_id and prompt_cache_key are accepted on both routes, and the session headers too', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: hello, max_tokens: 2, cache_salt: 'team-a', session_id: 'conv-1' });
    assert.equal(r.object, 'chat.completion');
    const c = await openai.completions.create({ ...greedy, prompt: 'Hello', max_tokens: 2, cache_salt: 'team-a', prompt_cache_key: 'conv-2' });
    assert.equal(c.object, 'text_completion');
    for (const header of ['x-session-affinity', 'session_id']) {
      const body = await smallChat(server.url, { [header]: 'conv-3' });
      assert.equal(body.object, 'chat.completion', header);
    }
  });

  test('GET /fit reports the sizes, the largest safe context, the predicted decode speed and the backend', async () => {
    const r = await fetch(`${server.url}/fit`);
    assert.equal(r.status, 200);
    const f = await r.json();
    for (const k of ['weights_bytes', 'kv_bytes_per_token', 'transient_bytes', 'max_safe_context', 'predicted_decode_tps', 'bandwidth_gbs'])
      assert.equal(typeof f[k], 'number', `${k}: ${JSON.stringify(f)}`);
    assert.ok(f.weights_bytes > 0 && f.kv_bytes_per_token > 0 && f.transient_bytes > 0, JSON.stringify(f));
    assert.ok('memory_budget_bytes' in f, 'memory_budget_bytes is reported (null without a budget)');
    assert.ok(f.max_safe_context > 0, 'the machine holds some context');
    assert.ok(f.bandwidth_gbs > 0 && f.predicted_decode_tps > 0, JSON.stringify(f));
    assert.equal(typeof f.backend?.name, 'string');
    assert.equal(typeof f.backend?.device, 'string');
    assert.ok(f.backend.memory_bytes > 0, JSON.stringify(f.backend));
  });

  test('with --memory-budget: the safe context is what fits, max_tokens is clamped to it, a prompt over it is a 400 context_over_budget', async () => {
    const main = await (await fetch(`${server.url}/fit`)).json();
    /* Room for 100.5 positions of KV beside the weights and buffers. */
    const bytes = main.weights_bytes + main.transient_bytes + 100.5 * main.kv_bytes_per_token;
    const s = await startServer(['--memory-budget', String(bytes / 1e9)], { name: 'memory-budget' });
    try {
      const f = await (await fetch(`${s.url}/fit`)).json();
      assert.equal(f.max_safe_context, 100, JSON.stringify(f));
      assert.equal(f.enforced_context_tokens, 100, JSON.stringify(f));
      assert.ok(Math.abs(f.memory_budget_bytes - bytes) <= 1, JSON.stringify(f));
      const c = client(s.url);
      const r = await c.completions.create({ model: modelId, prompt: Array(20).fill(100), max_tokens: 500, temperature: 0 });
      assert.equal(r.usage.prompt_tokens, 20);
      assert.ok(r.usage.completion_tokens <= 80, `max_tokens clamped to what the budget leaves: ${JSON.stringify(r.usage)}`);
      await assert.rejects(c.completions.create({ model: modelId, prompt: Array(150).fill(100), max_tokens: 5 }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status}`);
        assert.equal(e.code, 'context_over_budget', JSON.stringify(e.error));
        assert.match(e.error.message, /\b150\b/);
        assert.match(e.error.message, /\b100\b/);
        return true;
      });
      await smallChat(s.url);
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--memory-budget server exit ${JSON.stringify(r)}`);
    }
  });

  test('with --kv-budget: a request that alone exceeds it is a 400 naming both numbers; others wait their turn', async (t) => {
    const main = await (await fetch(`${server.url}/fit`)).json();
    /* Room for 150 positions: one 10 + 130 request at a time. */
    const budget = 150 * main.kv_bytes_per_token;
    const s = await startServer(['--kv-budget', String(budget / 1e9), '--batch', '4', '--kv-block-size', '32', '--prefill-chunk', '64'], { name: 'kv-budget' });
    try {
      const c = client(s.url);
      await assert.rejects(c.completions.create({ model: modelId, prompt: Array(10).fill(100), max_tokens: 400 }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status}`);
        assert.match(e.error.message, new RegExp(`\\b${410 * main.kv_bytes_per_token}\\b`), e.error.message);
        assert.match(e.error.message, new RegExp(`\\b${budget}\\b`), e.error.message);
        return true;
      });
      const run = async (name) => {
        const r = await sseRequest(s.url, '/v1/completions', { model: modelId, prompt: Array(10).fill(100 + name.length), max_tokens: 130, temperature: 0, stream: true });
        assert.equal(r.status, 200, r.raw);
        assert.ok(r.done, `${name} ended with [DONE]`);
        return r;
      };
      /* Two requests that fit only one at a time, with room for four in a step:
       * while they are in flight, /stats never shows both running. */
      let inFlight = true;
      const seen = [];
      const watching = (async () => {
        while (inFlight) {
          const e = (await (await fetch(`${s.url}/stats`)).json()).engine;
          seen.push(`${e.running}/${e.queue_depth}`);
          await sleep(2);
        }
      })();
      const both = await Promise.all(['a', 'bb'].map(run));
      inFlight = false;
      await watching;
      t.diagnostic(`/stats running/queued while both were in flight: ${[...new Set(seen)].join(' ')}`);
      assert.ok(seen.every((x) => Number(x.split('/')[0]) <= 1), `two ran at once under the KV budget: ${seen.join(' ')}`);
      assert.ok(both.every((r) => r.chunks.length > 0));
      await run('c');
      await smallChat(s.url);
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `--kv-budget server exit ${JSON.stringify(r)}`);
    }
  });

  test('--kv-block-size outside what the KV cache takes is a startup error', async () => {
    await assert.rejects(startServer(['--kv-block-size', '1000'], { name: 'kv-block-size' }), /block size 1000/);
  });
});

describe('prefix cache', () => {
  const system = {
    role: 'system',
    content: 'You are a careful assistant for a weather service. Answer in short sentences, name the ' +
      'city and the day, give temperatures in Celsius and say when you are unsure about a forecast.',
  };
  const question = (q) => [system, { role: 'user', content: q }];
  const questions = ['Will it rain in Oslo tomorrow?', 'How warm is Lisbon in May?', 'Is it windy in Wellington today?',
    'What should I wear in Montreal in January?', 'Does it snow in Kyoto?', 'Is Cairo hot at night?'];

  test('/stats has server, prompt_cache, batch and admission; /metrics exports them', async () => {
    const stats = await (await fetch(`${server.url}/stats`)).json();
    assert.equal(typeof stats.server?.started_at, 'number');
    assert.ok(Math.abs(stats.server.started_at - Date.now() / 1000) < 86400, `started_at ${stats.server.started_at}`);
    for (const k of ['blocks', 'bytes', 'max_bytes', 'hits', 'misses', 'hit_tokens', 'evictions', 'session_hits', 'session_misses', 'sessions'])
      assert.equal(typeof stats.prompt_cache?.[k], 'number', `prompt_cache.${k}`);
    assert.equal(stats.prompt_cache.max_bytes, 8 * 2 ** 30, 'the default cap is 8 GiB');
    for (const k of ['configured', 'running', 'waiting', 'kv_bytes', 'kv_budget_bytes'])
      assert.equal(typeof stats.batch?.[k], 'number', `batch.${k}`);
    assert.equal(stats.batch.configured, stats.engine.max_sequences);
    for (const k of ['enforced_context_tokens', 'rejected']) assert.equal(typeof stats.admission?.[k], 'number', `admission.${k}`);
    assert.equal(stats.admission.enforced_context_tokens, stats.engine.context);
    assert.equal(typeof stats.engine?.kv_blocks_free, 'number', 'the earlier fields stay');
    const m = await metrics(server.url);
    for (const name of ['inferd_prompt_cache_blocks', 'inferd_prompt_cache_bytes', 'inferd_prompt_cache_max_bytes', 'inferd_prompt_cache_hits_total',
      'inferd_prompt_cache_misses_total', 'inferd_prompt_cache_hit_tokens_total', 'inferd_prompt_cache_evictions_total',
      'inferd_prompt_cache_session_hits_total', 'inferd_prompt_cache_session_misses_total', 'inferd_prompt_cache_sessions',
      'inferd_batch_configured', 'inferd_batch_running', 'inferd_batch_waiting', 'inferd_kv_bytes', 'inferd_kv_budget_bytes',
      'inferd_admission_enforced_context_tokens', 'inferd_admission_rejected_total', 'inferd_server_started_at_seconds'])
      assert.ok(Number.isFinite(metricSum(m, name)), `${name} missing from /metrics`);
  });

  test('a resent prompt reuses its prefix: cached_tokens counts it and /stats counts the hit', async () => {
    const before = await (await fetch(`${server.url}/stats`)).json();
    const a = await openai.chat.completions.create({ ...greedy, messages: question('Is it sunny in Rome?'), max_tokens: 4 });
    const b = await openai.chat.completions.create({ ...greedy, messages: question('Is it sunny in Rome?'), max_tokens: 4 });
    assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 16, `cached_tokens ${b.usage.prompt_tokens_details.cached_tokens} of ${b.usage.prompt_tokens}`);
    assert.ok(b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens, 'the last prompt token is always computed');
    assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
    const after = await (await fetch(`${server.url}/stats`)).json();
    assert.ok(after.prompt_cache.hits > before.prompt_cache.hits);
    assert.ok(after.prompt_cache.hit_tokens >= before.prompt_cache.hit_tokens + b.usage.prompt_tokens_details.cached_tokens);
  });

  test('exact mode under a tiny --prompt-cache 0.001 (evicting all the time) answers as a server without the cache', { timeout: 180000 * slow }, async () => {
    const cold = await startServer(['--mode', 'exact', '--prompt-cache', '0'], { name: 'cache-off' });
    const tiny = await startServer(['--mode', 'exact', '--prompt-cache', '0.001', '--kv-mb', '4'], { name: 'cache-tiny' });
    try {
      const ask = async (url, q, extra = {}) => {
        const r = await client(url).chat.completions.create({ ...greedy, messages: question(q), max_tokens: 12, ...extra });
        return { text: r.choices[0].message.content, cached: r.usage.prompt_tokens_details.cached_tokens };
      };
      const want = [];
      for (const q of questions) want.push(await ask(cold.url, q));
      for (const w of want) assert.equal(w.cached, 0, 'nothing is reused with --prompt-cache 0');
      for (let round = 0; round < 2; round++) {
        const got = await Promise.all(questions.map((q) => ask(tiny.url, q)));
        got.forEach((g, i) => assert.equal(g.text, want[i].text, `round ${round}, question ${i}`));
      }
      const seeded = await ask(cold.url, questions[0], { temperature: 1, seed: 11 });
      const seededHit = await ask(tiny.url, questions[0], { temperature: 1, seed: 11 });
      assert.equal(seededHit.text, seeded.text, 'seeded sampling through the cache');
      const stats = await (await fetch(`${tiny.url}/stats`)).json();
      assert.ok(stats.prompt_cache.hits > 0, `no hit: ${JSON.stringify(stats.prompt_cache)}`);
      assert.ok(stats.prompt_cache.evictions > 0, `no eviction: ${JSON.stringify(stats.prompt_cache)}`);
      assert.ok(stats.prompt_cache.bytes <= stats.prompt_cache.max_bytes + stats.batch.kv_bytes);
      const off = await (await fetch(`${cold.url}/stats`)).json();
      assert.equal(off.prompt_cache.max_bytes, 0);
      assert.equal(off.prompt_cache.hits, 0);
    } finally {
      assert.equal((await cold.stop()).code, 0);
      assert.equal((await tiny.stop()).code, 0);
    }
  });

  test('POST /admin/cache/session/close: unknown session is {"closed": false}, a bad body 400, no key 401', async () => {
    const close = (url, body, headers = {}) =>
      fetch(`${url}/admin/cache/session/close`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    let r = await close(server.url, JSON.stringify({ session_id: 'never-opened' }));
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { closed: false });
    for (const bad of ['{"session_id": 5}', '{"session', '[]', '{}', JSON.stringify({ session_id: 'x'.repeat(300) })]) {
      r = await close(server.url, bad);
      assert.equal(r.status, 400, `body ${bad.slice(0, 40)}`);
      assert.equal(typeof (await r.json()).error?.message, 'string');
    }
    const s = await startServer(['--api-key', 'sk-admin'], { name: 'admin-key' });
    try {
      r = await close(s.url, JSON.stringify({ session_id: 'x' }));
      assert.equal(r.status, 401);
      r = await close(s.url, JSON.stringify({ session_id: 'x' }), { authorization: 'Bearer sk-admin' });
      assert.equal(r.status, 200);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
  });

  test('a session keeps its blocks until it is closed: closing releases them once', async () => {
    const sid = `e2e-session-${process.pid}`;
    await openai.chat.completions.create({ ...greedy, messages: question('Is it foggy in London?'), max_tokens: 4, session_id: sid });
    const stats = await (await fetch(`${server.url}/stats`)).json();
    assert.ok(stats.prompt_cache.sessions >= 1, `no open session: ${JSON.stringify(stats.prompt_cache)}`);
    const close = () => fetch(`${server.url}/admin/cache/session/close`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ session_id: sid }) }).then((r) => r.json());
    const first = await close();
    assert.equal(first.closed, true);
    assert.ok(first.blocks_released >= 1, JSON.stringify(first));
    assert.deepEqual(await close(), { closed: false });
  });

  test('multi-turn chat: turn 2 reuses all of turn 1, prompt and answer', async () => {
    const turn1 = [system, { role: 'user', content: 'Tell me about the weather in Bergen.' }];
    const a = await openai.chat.completions.create({ ...greedy, messages: turn1, max_tokens: 24 });
    const turn2 = [...turn1, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'And tomorrow?' }];
    const b = await openai.chat.completions.create({ ...greedy, messages: turn2, max_tokens: 4 });
    const want = a.usage.prompt_tokens + a.usage.completion_tokens;
    assert.ok(b.usage.prompt_tokens_details.cached_tokens >= want,
      `turn 2 reused ${b.usage.prompt_tokens_details.cached_tokens} tokens; turn 1 was ${a.usage.prompt_tokens} + ${a.usage.completion_tokens}`);
  });
});

/* The chat template's rendering of messages (with the generation prompt), as the server renders it. */
function renderChat(messages) {
  const out = execFileSync(binary, ['template', modelDir], { input: JSON.stringify({ messages, add_generation_prompt: true }) + '\n' });
  const r = JSON.parse(out.toString());
  assert.equal(r.error, undefined, r.error);
  return r.text;
}

/* How many ids the tokenizer gives text on its own (no added special tokens, as chat prompts are encoded). */
function tokenCount(text) {
  const out = execFileSync(binary, ['tokenize', modelDir, '--jsonl', '--no-special'], { input: JSON.stringify(text) + '\n' });
  return JSON.parse(out.toString()).length;
}

describe('exact re-encoding', () => {
  test('turn 2 resends turn 1\'s answer as the ids the model generated, where re-tokenizing the text gives others', async (t) => {
    /* A greedy answer whose text the tokenizer would split differently from how it was sampled
     * (the test model's answers are arbitrary tokens, so nearly any answer is one). */
    let probe = null;
    for (let i = 0; i < 8 && !probe; i++) {
      const question = [{ role: 'user', content: `Re-encoding probe ${i}: say anything.` }];
      const r1 = await openai.chat.completions.create({ ...greedy, messages: question, max_tokens: 16 });
      const c = r1.choices[0];
      if (c.finish_reason !== 'length' || c.message.reasoning_content) continue;
      const answer = c.message.content ?? '';
      const messages = [...question, { role: 'assistant', content: answer }, { role: 'user', content: 'And then?' }];
      const before = renderChat(question);
      const text = renderChat(messages);
      assert.ok(text.startsWith(before + answer), 'the template resends the answer right after the first prompt');
      const tail = text.slice(before.length + answer.length);
      const exact = r1.usage.prompt_tokens + r1.usage.completion_tokens + tokenCount(tail);
      const plain = tokenCount(text);
      if (plain !== exact) probe = { r1, messages, exact, plain };
    }
    assert.ok(probe, 'none of 8 greedy answers re-tokenizes differently from how it was sampled');
    const r2 = await openai.chat.completions.create({ ...greedy, messages: probe.messages, max_tokens: 2 });
    t.diagnostic(`turn 1: ${probe.r1.usage.prompt_tokens} prompt + ${probe.r1.usage.completion_tokens} generated; turn 2: ${r2.usage.prompt_tokens} prompt tokens (re-tokenized: ${probe.plain})`);
    assert.equal(r2.usage.prompt_tokens, probe.exact,
      `turn 2's prompt is turn 1's prompt ids + its generated ids + the template's tail (a re-tokenization has ${probe.plain})`);
    const stats = await (await fetch(`${server.url}/stats`)).json();
    assert.ok(stats.reencode.entries >= 1 && stats.reencode.hits >= 1, `/stats reencode: ${JSON.stringify(stats.reencode)}`);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const hits = Number(/^inferd_reencode_hits_total (\d+)$/m.exec(metrics)?.[1]);
    assert.ok(hits >= stats.reencode.hits, `/metrics inferd_reencode_hits_total ${hits}`);

    /* Streamed replies are remembered too. */
    const question = [{ role: 'user', content: 'Re-encoding probe: streamed.' }];
    const stream = await openai.chat.completions.create({ ...greedy, messages: question, max_tokens: 16, stream: true, stream_options: { include_usage: true } });
    let answer = '';
    let usage = null;
    let finish = null;
    for await (const ch of stream) {
      if (ch.usage) usage = ch.usage;
      const c = ch.choices[0];
      if (c?.delta?.content) answer += c.delta.content;
      if (c?.finish_reason) finish = c.finish_reason;
    }
    if (finish === 'length') {
      const messages = [...question, { role: 'assistant', content: answer }, { role: 'user', content: 'And then?' }];
      const before = renderChat(question);
      const tail = renderChat(messages).slice(before.length + answer.length);
      const r = await openai.chat.completions.create({ ...greedy, messages, max_tokens: 2 });
      assert.equal(r.usage.prompt_tokens, usage.prompt_tokens + usage.completion_tokens + tokenCount(tail));
    }
  });
});

describe('tool calls', () => {
  const weatherTool = { type: 'function', function: { name: 'get_weather', description: 'Weather by city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
  const ask = [{ role: 'user', content: 'What is the weather in Paris? Use the tool.' }];

  /* Whatever the random model writes, the reply is well formed: a finish reason chat clients
   * know, and every call has an id, a name and arguments that are a JSON object. */
  const assertWellFormed = (choice) => {
    assert.ok(['stop', 'length', 'tool_calls'].includes(choice.finish_reason), choice.finish_reason);
    const calls = choice.message.tool_calls ?? [];
    assert.equal(choice.finish_reason === 'tool_calls', calls.length > 0);
    for (const c of calls) {
      assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(c.type, 'function');
      assert.equal(typeof c.function.name, 'string');
      const args = JSON.parse(c.function.arguments);
      assert.equal(typeof args, 'object');
      assert.ok(args !== null && !Array.isArray(args));
    }
    if (calls.length === 0) assert.equal(typeof choice.message.content, 'string');
  };

  test('a request with tools gets a well-formed reply (stop, length or tool_calls)', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: ask, tools: [weatherTool], max_tokens: 24 });
    assertWellFormed(r.choices[0]);
  });

  test('streamed with tools, the SDK assembles the reply (finalChatCompletion)', async () => {
    const stream = openai.chat.completions.stream({ ...greedy, messages: ask, tools: [weatherTool], tool_choice: 'auto', max_tokens: 24 });
    const final = await stream.finalChatCompletion();
    assertWellFormed(final.choices[0]);
  });

  test('the SDK\'s runTools helper runs to a final answer', async () => {
    const seen = [];
    /* The helper refuses a reply cut by max_tokens; the random model's text would be, so the
     * end-of-turn token (<|im_end|>) is made certain and the reply ends with "stop". */
    const runner = openai.chat.completions.runTools({
      ...greedy, messages: ask, max_tokens: 16, logit_bias: { 151645: 100 },
      tools: [{ type: 'function', function: { ...weatherTool.function, parse: JSON.parse, function: (args) => { seen.push(args); return { temp_c: 12 }; } } }],
    });
    const final = await runner.finalChatCompletion();
    assertWellFormed(final.choices[0]);
    for (const args of seen) assert.equal(typeof args, 'object');
  });

  test('a conversation with an assistant tool call (arguments as a string) and its result renders and answers, streamed too', async () => {
    const messages = [
      ...ask,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_x', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_x', content: '{"temp_c": 12}' },
    ];
    const r = await openai.chat.completions.create({ ...greedy, messages, tools: [weatherTool], max_tokens: 8 });
    assertWellFormed(r.choices[0]);
    const stream = openai.chat.completions.stream({ ...greedy, messages, tools: [weatherTool], max_tokens: 8 });
    assertWellFormed((await stream.finalChatCompletion()).choices[0]);
  });

  test('tool_choice "none" sends no tool calls', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: ask, tools: [weatherTool], tool_choice: 'none', max_tokens: 12 });
    assert.equal(r.choices[0].message.tool_calls, undefined);
    assert.notEqual(r.choices[0].finish_reason, 'tool_calls');
  });

  test('a tool message that answers no earlier call is a 400 naming its tool_call_id', async () => {
    await assert.rejects(openai.chat.completions.create({
      ...greedy, max_tokens: 2, tools: [weatherTool],
      messages: [...ask, { role: 'tool', tool_call_id: 'call_nowhere', content: '12' }],
    }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status} ${e?.message}`);
      assert.equal(e.param, 'messages[1].tool_call_id');
      assert.match(e.message, /call_nowhere/);
      return true;
    });
  });
});

describe('developer messages', () => {
  test('a developer message renders as the system message it maps to', async () => {
    const ask = (role) => openai.chat.completions.create({ ...greedy, max_tokens: 2, messages: [{ role, content: 'Answer in one word.' }, { role: 'user', content: 'Weather?' }] });
    const [developer, system] = await Promise.all([ask('developer'), ask('system')]);
    assert.equal(developer.usage.prompt_tokens, system.usage.prompt_tokens);
    assert.equal(developer.choices[0].message.content, system.choices[0].message.content);
  });
});

describe('mlx-lm sampler extras', () => {
  const extras = { xtc_probability: 1, xtc_threshold: 0.1, repetition_penalty: 1.3, repetition_context_size: 4, presence_penalty: 0.5, presence_context_size: 8, frequency_penalty: 0.5, frequency_context_size: 8 };

  test('XTC and the penalty windows are accepted through the SDK, and a seed reproduces the reply', async () => {
    const ask = () => openai.chat.completions.create({ model: modelId, messages: hello, max_tokens: 8, temperature: 1, seed: 17, ...extras });
    const [a, b] = await Promise.all([ask(), ask()]);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
    const t = await openai.completions.create({ model: modelId, prompt: 'Once upon', max_tokens: 4, temperature: 1, seed: 3, ...extras });
    assert.equal(typeof t.choices[0].text, 'string');
  });

  const bad = async (body, param) => {
    await assert.rejects(openai.chat.completions.create({ model: modelId, messages: hello, max_tokens: 2, ...body }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name} ${e?.status} ${e?.message}`);
      assert.equal(e.param, param);
      assert.match(e.message, new RegExp(param));
      return true;
    });
  };
  test('xtc_threshold 0.6 is a BadRequestError naming it', () => bad({ xtc_threshold: 0.6 }, 'xtc_threshold'));
  test('xtc_probability -1 is a BadRequestError naming it', () => bad({ xtc_probability: -1 }, 'xtc_probability'));
  test('a negative repetition_context_size is a BadRequestError naming it', () => bad({ repetition_context_size: -1 }, 'repetition_context_size'));
});
