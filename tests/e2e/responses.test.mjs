// tests/e2e/responses.test.mjs — the Responses API through the official openai SDK (create, stream, retrieve, delete, previous_response_id chains, store false), GET /v1, /v1/models capabilities and chat's reasoning fields.
//
// The test model has random weights, so its text is arbitrary; what is checked is the protocol,
// the stored conversation (the second turn's prompt holds the first turn and hits the prefix
// cache) and the values that hold for any model.
import { execFileSync } from 'node:child_process';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { binary, client, modelDir, modelId, sleep, slow, sseRequest, startServer, useMainServer } from './lib/harness.mjs';

let server;
let openai;

useMainServer((s, c) => {
  server = s;
  openai = c;
});

const greedy = { model: modelId, temperature: 0 };

/* The id of a single token of the test model's tokenizer. */
function tokenId(text) {
  const out = execFileSync(binary, ['tokenize', modelDir, '--jsonl', '--no-special'], { input: JSON.stringify(text) + '\n' });
  const ids = JSON.parse(out.toString());
  assert.equal(ids.length, 1, `${text} is ${ids.length} tokens`);
  return ids[0];
}

/* Forces the model to open a think block at once, so the reply has a reasoning part. */
const thinkFirst = () => ({ [String(tokenId('<think>'))]: 100 });

async function getJson(path, init = {}) {
  const r = await fetch(`${server.url}${path}`, init);
  return { status: r.status, body: await r.json() };
}

describe('responses.create', () => {
  test('a string input gives a completed-or-incomplete Response with a message item and usage', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'Say hello.', max_output_tokens: 12 });
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, 'response');
    assert.ok(Math.abs(r.created_at - Date.now() / 1000) < 600, `created_at ${r.created_at}`);
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    assert.equal(r.error, null);
    assert.equal(r.model, modelId);
    const msg = r.output.find((o) => o.type === 'message');
    assert.ok(msg, JSON.stringify(r.output));
    assert.match(msg.id, /^msg_/);
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.deepEqual(msg.content[0].annotations, []);
    assert.equal(typeof r.output_text, 'string');
    assert.equal(r.output_text, msg.content[0].text, 'the SDK assembles output_text from the message');
    assert.ok(r.usage.input_tokens > 0);
    assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
    assert.equal(typeof r.usage.output_tokens_details.reasoning_tokens, 'number');
    assert.equal(r.store, true);
    assert.equal(r.temperature, 0);
    assert.equal(r.max_output_tokens, 12);
    assert.equal(r.previous_response_id, null);
    assert.equal(r.tool_choice, 'auto');
    assert.deepEqual(r.tools, []);
    assert.equal(r.text.format.type, 'text');
  });

  test('items (developer, user parts, an earlier assistant turn with a call and its output) and instructions are rendered', async () => {
    const base = { ...greedy, input: 'Weather?', max_output_tokens: 1 };
    const plain = await openai.responses.create(base);
    const withInstructions = await openai.responses.create({ ...base, instructions: 'You answer in one word.' });
    assert.ok(withInstructions.usage.input_tokens > plain.usage.input_tokens + 3, `${withInstructions.usage.input_tokens} vs ${plain.usage.input_tokens}`);
    assert.equal(withInstructions.instructions, 'You answer in one word.');
    const r = await openai.responses.create({
      ...greedy,
      max_output_tokens: 4,
      instructions: 'Be terse.',
      input: [
        { role: 'developer', content: 'Answer in one word.' },
        { role: 'user', content: [{ type: 'input_text', text: 'Weather in Paris?' }] },
        { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'I should look it up.' }] },
        { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": 12}' },
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Mild.', annotations: [] }] },
        { role: 'user', content: 'And now?' },
      ],
      tools: [{ type: 'function', name: 'get_weather', description: 'Weather by city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }, strict: true }],
      tool_choice: 'auto',
      reasoning: { effort: 'low' },
      metadata: { suite: 'e2e' },
    });
    assert.ok(['completed', 'incomplete'].includes(r.status));
    assert.ok(r.usage.input_tokens > withInstructions.usage.input_tokens + 30, `${r.usage.input_tokens} prompt tokens`);
    assert.deepEqual(r.metadata, { suite: 'e2e' });
    assert.equal(r.tools.length, 1);
    assert.equal(r.tools[0].name, 'get_weather');
    assert.equal(r.reasoning.effort, 'low');
  });

  test('max_output_tokens cuts the answer: status incomplete, reason max_output_tokens', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'Tell me a long story.', max_output_tokens: 3, logit_bias: { [String(tokenId('<|im_end|>'))]: -100 } });
    assert.equal(r.status, 'incomplete');
    assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
    assert.equal(r.usage.output_tokens, 3);
  });

  test('a reasoning part becomes a reasoning item with summary text before the message', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'Think first.', max_output_tokens: 6, logit_bias: thinkFirst() });
    assert.equal(r.output[0].type, 'reasoning', JSON.stringify(r.output));
    assert.match(r.output[0].id, /^rs_/);
    assert.equal(r.output[0].summary[0].type, 'summary_text');
    assert.ok(r.output[0].summary[0].text.length > 0);
    assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
    assert.ok(r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens);
  });

  test('reasoning.effort takes every value chat takes, xhigh included', async () => {
    for (const effort of ['none', 'minimal', 'low', 'medium', 'high', 'xhigh']) {
      const r = await openai.responses.create({ ...greedy, input: 'hi', max_output_tokens: 1, reasoning: { effort } });
      assert.equal(r.reasoning.effort, effort);
    }
  });
});

describe('responses.stream', () => {
  test('the event chain is in order with sequence numbers, and finalResponse assembles it', async () => {
    const stream = openai.responses.stream({ ...greedy, input: 'Say hello.', max_output_tokens: 8, logit_bias: thinkFirst() });
    const events = [];
    for await (const ev of stream) events.push(ev);
    const final = await stream.finalResponse();
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
    events.forEach((e, i) => assert.equal(e.sequence_number, i, `${e.type} at ${i}`));
    // The reasoning item's events, then the message's.
    const order = ['response.output_item.added', 'response.reasoning_summary_part.added', 'response.reasoning_summary_text.delta', 'response.reasoning_summary_text.done', 'response.reasoning_summary_part.done', 'response.output_item.done', 'response.output_item.added', 'response.content_part.added', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done'];
    let at = 0;
    for (const t of types) if (t === order[at]) at++;
    assert.equal(at, order.length, `events out of order: ${types.join(' ')}`);
    assert.equal(final.id, events[0].response.id);
    assert.equal(final.status, types.at(-1).slice('response.'.length));
    assert.equal(final.output[0].type, 'reasoning');
    const deltas = events.filter((e) => e.type === 'response.reasoning_summary_text.delta').map((e) => e.delta).join('');
    assert.equal(final.output[0].summary[0].text, deltas);
    const msg = final.output.find((o) => o.type === 'message');
    const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    assert.equal(msg.content[0].text, text);
    assert.equal(final.output_text, text);
    assert.ok(final.usage.output_tokens > 0);
  });

  test('a streamed answer equals the same greedy answer made whole', async () => {
    const body = { ...greedy, input: 'Count to five.', max_output_tokens: 10 };
    const whole = await openai.responses.create(body);
    const stream = openai.responses.stream(body);
    const final = await stream.finalResponse();
    assert.equal(final.output_text, whole.output_text);
    assert.equal(final.status, whole.status);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  test('the raw stream is `event: TYPE` + `data: JSON` blocks', async () => {
    const r = await fetch(`${server.url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...greedy, input: 'hi', max_output_tokens: 2, stream: true }) });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const blocks = (await r.text()).split('\n\n').filter((b) => b && !b.startsWith(':'));
    for (const b of blocks) {
      const m = /^event: (\S+)\ndata: (.*)$/s.exec(b);
      assert.ok(m, `not an event block: ${b.slice(0, 80)}`);
      assert.equal(JSON.parse(m[2]).type, m[1]);
    }
  });
});

describe('the response store', () => {
  test('retrieve returns the stored response; delete removes it and a second retrieve is a 404', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'Remember me.', max_output_tokens: 4 });
    const got = await openai.responses.retrieve(r.id);
    assert.equal(got.id, r.id);
    assert.equal(got.output_text, r.output_text);
    assert.deepEqual(got.usage, r.usage);
    await openai.responses.delete(r.id); // its body is checked raw below
    await assert.rejects(openai.responses.retrieve(r.id), (e) => e.status === 404);
    const again = await fetch(`${server.url}/v1/responses/${r.id}`, { method: 'DELETE' });
    assert.equal(again.status, 404);
    const r2 = await openai.responses.create({ ...greedy, input: 'Delete me.', max_output_tokens: 2 });
    const raw = await getJson(`/v1/responses/${r2.id}`, { method: 'DELETE' });
    assert.equal(raw.status, 200);
    assert.deepEqual(raw.body, { id: r2.id, object: 'response.deleted', deleted: true });
  });

  test('an unknown id is a 404 in the OpenAI error shape', async () => {
    const { status, body } = await getJson('/v1/responses/resp_doesnotexist');
    assert.equal(status, 404);
    assert.equal(typeof body.error.message, 'string');
    assert.equal(body.error.type, 'invalid_request_error');
  });

  test('store false keeps nothing: retrieve and previous_response_id are 404s', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'Forget me.', max_output_tokens: 2, store: false });
    assert.equal(r.store, false);
    await assert.rejects(openai.responses.retrieve(r.id), (e) => e.status === 404);
    await assert.rejects(openai.responses.create({ ...greedy, input: 'and?', max_output_tokens: 2, previous_response_id: r.id }), (e) => {
      assert.equal(e.status, 404);
      assert.equal(e.param, 'previous_response_id');
      assert.match(e.message, /not found or expired/);
      return true;
    });
  });

  test('previous_response_id renders the earlier turn first: the second prompt holds it and hits the prefix cache', async () => {
    const first = await openai.responses.create({ ...greedy, instructions: 'You are a parrot.', input: 'Repeat: blue sky.', max_output_tokens: 8 });
    const second = await openai.responses.create({ ...greedy, input: 'Again, please.', max_output_tokens: 4, previous_response_id: first.id });
    assert.equal(second.previous_response_id, first.id);
    assert.equal(second.instructions, 'You are a parrot.', 'instructions carry forward');
    // The second prompt is the first prompt, its answer, and the new turn.
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, `${second.usage.input_tokens} vs ${first.usage.input_tokens} + ${first.usage.output_tokens}`);
    assert.ok(second.usage.input_tokens_details.cached_tokens > 0, `cached_tokens ${second.usage.input_tokens_details.cached_tokens}`);
    assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1, `cached ${second.usage.input_tokens_details.cached_tokens} of the first prompt's ${first.usage.input_tokens}`);
    // The same conversation sent whole gives the same prompt.
    const whole = await openai.responses.create({
      ...greedy,
      max_output_tokens: 1,
      store: false,
      instructions: 'You are a parrot.',
      input: [{ role: 'user', content: 'Repeat: blue sky.' }, { role: 'assistant', content: first.output_text }, { role: 'user', content: 'Again, please.' }],
    });
    assert.equal(whole.usage.input_tokens, second.usage.input_tokens, 'the chain renders as the conversation sent whole');
    // A third turn continues from the second, streamed.
    const stream = openai.responses.stream({ ...greedy, input: 'Once more.', max_output_tokens: 2, previous_response_id: second.id });
    const third = await stream.finalResponse();
    assert.ok(third.usage.input_tokens > second.usage.input_tokens);
    assert.ok(third.usage.input_tokens_details.cached_tokens > 0);
    const stored = await openai.responses.retrieve(third.id);
    assert.equal(stored.output_text, third.output_text);
  });

  test('/stats and /metrics report the store', async () => {
    await openai.responses.create({ ...greedy, input: 'Count me.', max_output_tokens: 2 });
    const stats = await (await fetch(`${server.url}/stats`)).json();
    const s = stats.response_store;
    assert.ok(s.entries >= 1 && s.bytes > 0, JSON.stringify(s));
    assert.ok(s.max_bytes >= s.bytes);
    assert.equal(typeof s.ttl_s, 'number');
    const text = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(text, /^inferd_response_store_entries \d+$/m);
    assert.match(text, /^inferd_response_store_bytes \d+$/m);
  });
});

describe('bad requests', () => {
  test('text.format json_schema constrains the answer; an unsupported construct is a 400 naming text.format', async () => {
    const r = await openai.responses.create({ ...greedy, input: 'x', max_output_tokens: 40, text: { format: { type: 'json_schema', name: 'n', schema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false } } } });
    if (r.status === 'completed') assert.equal(typeof JSON.parse(r.output_text).ok, 'boolean');
    await assert.rejects(openai.responses.create({ ...greedy, input: 'x', text: { format: { type: 'json_schema', name: 'n', schema: { type: 'object', patternProperties: { '^a': { type: 'string' } } } } } }), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.param, /^text\.format/);
      assert.match(e.message, /patternProperties/);
      return true;
    });
  });

  test('an input_image part is a 400 naming the part', async () => {
    await assert.rejects(openai.responses.create({ ...greedy, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png', detail: 'auto' }] }] }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'input[0].content[0].type');
      assert.match(e.message, /not supported by this model/);
      return true;
    });
  });
});

describe('GET /v1 and /v1/models', () => {
  test('GET /v1 lists every route', async () => {
    const { status, body } = await getJson('/v1');
    assert.equal(status, 200);
    assert.equal(body.name, 'inferd');
    assert.equal(body.model, modelId);
    const routes = body.endpoints.map((e) => `${e.method} ${e.path}`);
    for (const want of ['POST /v1/chat/completions', 'POST /v1/completions', 'GET /v1/models', 'POST /v1/responses', 'GET /v1/responses/{id}', 'DELETE /v1/responses/{id}', 'GET /health', 'GET /stats']) {
      assert.ok(routes.includes(want), `${want} missing from ${routes.join(', ')}`);
    }
  });

  test('model entries carry capability fields beside the existing ones', async () => {
    const list = await openai.models.list();
    const m = list.data[0];
    assert.equal(m.id, modelId);
    assert.equal(m.object, 'model');
    assert.equal(m.owned_by, 'inferd');
    assert.equal(typeof m.context_window, 'number');
    assert.equal(m.tools, true, 'the Qwen3 template renders tools');
    assert.equal(m.reasoning, true, 'the Qwen3 template thinks');
    assert.equal(m.structured_output, true);
    assert.equal(typeof m.gen_defaults.temperature, 'number');
    assert.equal(typeof m.gen_defaults.top_p, 'number');
    assert.equal(typeof m.gen_defaults.top_k, 'number');
    const one = await openai.models.retrieve(modelId);
    assert.equal(one.tools, true);
  });
});

describe('chat completions, the reasoning fields', () => {
  test('reasoning sits beside reasoning_content in the message and in stream deltas', async () => {
    const body = { ...greedy, messages: [{ role: 'user', content: 'Think.' }], max_tokens: 6, logit_bias: thinkFirst() };
    const r = await openai.chat.completions.create(body);
    const msg = r.choices[0].message;
    assert.ok(msg.reasoning_content, JSON.stringify(msg));
    assert.equal(msg.reasoning, msg.reasoning_content);
    const res = await sseRequest(server.url, '/v1/chat/completions', { ...body, stream: true });
    let rc = '';
    let rs = '';
    for (const ch of res.chunks) {
      const d = ch.choices?.[0]?.delta ?? {};
      assert.equal(d.reasoning, d.reasoning_content, JSON.stringify(d));
      rc += d.reasoning_content ?? '';
      rs += d.reasoning ?? '';
    }
    assert.equal(rs, rc);
    assert.equal(rc, msg.reasoning_content);
  });

  test('reasoning_effort xhigh is accepted', async () => {
    const r = await openai.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, reasoning_effort: 'xhigh' });
    assert.equal(r.object, 'chat.completion');
  });
});

describe('serve flags', () => {
  test('--thinking off is enable_thinking false when a request says nothing; --response-store-ttl-s expires stored responses', { timeout: 120000 * slow }, async () => {
    const s = await startServer(['--thinking', 'off', '--response-store-ttl-s', '1']);
    try {
      const c = client(s.url);
      const body = { ...greedy, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };
      const off = await c.chat.completions.create(body);
      const on = await openai.chat.completions.create(body);
      // Qwen3's template writes an empty think block when thinking is off.
      assert.ok(off.usage.prompt_tokens > on.usage.prompt_tokens, `${off.usage.prompt_tokens} vs ${on.usage.prompt_tokens}`);
      const asked = await c.chat.completions.create({ ...body, chat_template_kwargs: { enable_thinking: true } });
      assert.equal(asked.usage.prompt_tokens, on.usage.prompt_tokens, 'the request still decides');
      const effort = await c.chat.completions.create({ ...body, reasoning_effort: 'high' });
      assert.equal(effort.usage.prompt_tokens, on.usage.prompt_tokens, 'a reasoning effort turns thinking on');

      const r = await c.responses.create({ ...greedy, input: 'Expire me.', max_output_tokens: 1 });
      assert.equal((await c.responses.retrieve(r.id)).id, r.id);
      await sleep(1500);
      await assert.rejects(c.responses.retrieve(r.id), (e) => e.status === 404);
      await assert.rejects(c.responses.create({ ...greedy, input: 'x', max_output_tokens: 1, previous_response_id: r.id }), (e) => e.status === 404);
    } finally {
      const r = await s.stop();
      assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}`);
    }
  });
});
