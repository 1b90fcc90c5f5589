// tests/e2e/bad_input.test.mjs — hostile and malformed HTTP over raw TCP sockets; after every case the server still answers /health and a normal chat.
//
// Slow-header (slowloris) connections are opened when the suite starts and dribble one byte a
// second while the other cases run, so those cases also prove that other clients are served
// meanwhile; the last test checks that the server timed every slow connection out.
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { assertServing, mainServer, metrics, metricSum, modelId, sleep, slow } from './lib/harness.mjs';
import { describe as show, exchange, hostPort, isErrorObject, jsonBody, request } from './lib/raw.mjs';

/* How long a slow-header connection may live before the server must have closed it. */
const SLOWLORIS_LIMIT_S = Number(process.env.INFERD_E2E_SLOWLORIS_LIMIT_S || 60);
const SLOW_CONNECTIONS = 16;

let server;
let url;
let slowloris;

const chatBody = JSON.stringify({ model: modelId, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
const json = { 'Content-Type': 'application/json' };

/* One request on a fresh connection; resolves the exchange (see raw.mjs). */
const send = (bytes, opts) => exchange(url, [bytes], opts);

/* Opens a connection that sends a header byte every second and never finishes;
 * resolves {closedAfterS, status} when the server closes it or the limit passes. */
function slowHeaders(idle) {
  const { host, port } = hostPort(url);
  return new Promise((resolve) => {
    const t0 = Date.now();
    const sock = net.connect({ host, port });
    let data = Buffer.alloc(0);
    let timer = null;
    let done = false;
    const finish = (closedByServer) => {
      if (done) return;
      done = true;
      clearInterval(timer);
      clearTimeout(limit);
      sock.destroy();
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(data.toString('latin1'));
      resolve({ closedByServer, closedAfterS: (Date.now() - t0) / 1000, status: m ? Number(m[1]) : null });
    };
    const limit = setTimeout(() => finish(false), SLOWLORIS_LIMIT_S * 1000);
    sock.on('data', (d) => {
      data = Buffer.concat([data, d]);
    });
    sock.on('error', () => {});
    sock.on('close', () => finish(true));
    sock.on('connect', () => {
      if (idle) return;
      sock.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
      timer = setInterval(() => {
        if (!sock.destroyed) sock.write('a');
      }, 1000);
    });
  });
}

before(async () => {
  server = await mainServer();
  url = server.url;
  slowloris = Promise.all([
    ...Array.from({ length: SLOW_CONNECTIONS - 1 }, () => slowHeaders(false)),
    slowHeaders(true),
  ]);
});

after(async () => {
  if (server?.own) {
    const r = await server.stop();
    assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}`);
  }
});

afterEach(async () => {
  await assertServing(url);
});

const expectStatus = (res, statuses, what) => {
  const list = [].concat(statuses);
  assert.ok(list.includes(res.firstStatus), `${what}: want HTTP ${list.join(' or ')}, got ${show(res)}`);
};

const expectOpenAIError = (res, status, what) => {
  expectStatus(res, status, what);
  const body = jsonBody(res.responses[0]);
  assert.ok(isErrorObject(body), `${what}: body is not an OpenAI error object: ${res.responses[0].body.toString('utf8').slice(0, 300)}`);
  return body;
};

describe('malformed JSON', () => {
  test('truncated JSON is a 400 with an OpenAI error object', async () => {
    const body = '{"model":"m","messages":[{"role":"user","content":"hel';
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body })), 400, 'truncated JSON');
  });

  test('JSON with trailing garbage, a bare string and a top-level array are 400s', async () => {
    for (const body of [`${chatBody} x`, '"hello"', `[${chatBody}]`, '{}', 'null']) {
      expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body })), 400, body.slice(0, 40));
    }
  });

  test('100k levels of nested arrays and of nested objects are 400s, not a crash', { timeout: 30000 * slow }, async () => {
    const depth = 100000;
    const arrays = `{"model":"m","messages":${'['.repeat(depth)}${']'.repeat(depth)}}`;
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body: arrays }), { timeoutMs: 20000 * slow }), 400, 'nested arrays');
    const objects = `{"model":"m","messages":[{"role":"user","content":"x","extra":${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}}]}`;
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body: objects }), { timeoutMs: 20000 * slow }), 400, 'nested objects');
    const unclosed = `{"model":"m","messages":${'['.repeat(depth)}`;
    expectOpenAIError(await send(request('POST', '/v1/completions', { headers: json, body: unclosed }), { timeoutMs: 20000 * slow }), 400, 'unclosed nesting');
  });

  test('huge numbers (1e999, 99999999999999999999) for max_tokens and temperature are 400s', async () => {
    for (const [field, num] of [['max_tokens', '1e999'], ['max_tokens', '99999999999999999999'], ['max_tokens', '-99999999999999999999'], ['max_tokens', '4.5'], ['temperature', '1e999'], ['temperature', '-1e999'], ['top_p', '1e-999999'], ['seed', '1e999']]) {
      const body = `{"model":"m","messages":[{"role":"user","content":"hi"}],"${field}":${num}}`;
      const res = await send(request('POST', '/v1/chat/completions', { headers: json, body }));
      if (field === 'top_p') {
        // 1e-999999 underflows to 0, which is in range: any well-formed answer, as long as it answers.
        expectStatus(res, [200, 400], `${field}: ${num}`);
        continue;
      }
      const err = expectOpenAIError(res, 400, `${field}: ${num}`);
      // An integer past 64 bits may be refused while parsing, before the field is known.
      assert.ok(err.error.param === field || err.error.param === null, `${field}: ${num}: param ${err.error.param}`);
    }
  });

  test('speculative that is not a boolean is a 400 naming the field', async () => {
    for (const value of ['"false"', '0', '[]', '{}']) {
      for (const route of ['/v1/chat/completions', '/v1/completions']) {
        const body = route === '/v1/completions'
          ? `{"model":"m","prompt":"hi","speculative":${value}}`
          : `{"model":"m","messages":[{"role":"user","content":"hi"}],"speculative":${value}}`;
        const err = expectOpenAIError(await send(request('POST', route, { headers: json, body })), 400, `speculative: ${value}`);
        assert.match(err.error.message, /speculative/, `${route} speculative: ${value}: ${err.error.message}`);
      }
    }
  });
});

describe('invalid bytes', () => {
  test('invalid UTF-8 inside a JSON string is a 400', async () => {
    for (const bad of [[0xff], [0xc3, 0x28], [0xe2, 0x82], [0xed, 0xa0, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc0, 0xaf]]) {
      const body = Buffer.concat([Buffer.from('{"model":"m","messages":[{"role":"user","content":"a'), Buffer.from(bad), Buffer.from('b"}],"max_tokens":2}')]);
      expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body })), 400, `bytes ${bad.map((b) => b.toString(16)).join(' ')}`);
    }
  });

  test('a lone surrogate escape (\\ud800) gets an answer, not a crash', async () => {
    const body = '{"model":"m","messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":2}';
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: json, body })), [200, 400], 'lone surrogate');
  });

  test('invalid UTF-8 in a header value or name is answered (ignored or 400)', async (t) => {
    const value = await send(request('GET', '/health', { raw: [Buffer.from([0x58, 0x2d, 0x4a, 0x3a, 0x20, 0xff, 0xfe, 0xc3, 0x28])] }));
    expectStatus(value, [200, 400], 'invalid UTF-8 header value');
    const name = await send(request('GET', '/health', { raw: [Buffer.from([0x58, 0xff, 0x3a, 0x20, 0x61])] }));
    expectStatus(name, [200, 400], 'invalid byte in a header name');
    const authz = await send(request('POST', '/v1/chat/completions', { headers: json, body: chatBody, raw: [Buffer.from([0x41, 0x75, 0x74, 0x68, 0x6f, 0x72, 0x69, 0x7a, 0x61, 0x74, 0x69, 0x6f, 0x6e, 0x3a, 0x20, 0x42, 0x65, 0x61, 0x72, 0x65, 0x72, 0x20, 0xff, 0xc3])] }));
    expectStatus(authz, [200, 400], 'invalid UTF-8 in Authorization (no --api-key)');
    t.diagnostic(`invalid UTF-8 in a header value: ${value.firstStatus}, in a header name: ${name.firstStatus}, in Authorization: ${authz.firstStatus}`);
  });

  test('a raw NUL inside a JSON string or between tokens is a 400; an escaped \\u0000 is answered', async () => {
    const inString = Buffer.from('{"model":"m","messages":[{"role":"user","content":"a\u0000b"}]}');
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body: inString })), 400, 'raw NUL in a string');
    const between = Buffer.from('{"model":"m",\u0000"messages":[{"role":"user","content":"ab"}]}');
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: json, body: between })), 400, 'raw NUL between tokens');
    const escaped = '{"model":"m","messages":[{"role":"user","content":"a\\u0000b"}],"max_tokens":2}';
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: json, body: escaped })), [200, 400], 'escaped NUL');
  });

  test('NUL bytes in a header value, a header name and the request target are answered (400 or ignored)', async () => {
    expectStatus(await send(request('GET', '/health', { raw: ['X-Nul: a\u0000b'] })), [200, 400], 'NUL in a header value');
    expectStatus(await send(request('GET', '/health', { raw: ['X-N\u0000l: ab'] })), 400, 'NUL in a header name');
    expectStatus(await send(Buffer.from('GET /hea\u0000lth HTTP/1.1\r\nHost: x\r\n\r\n', 'latin1')), [400, 404], 'NUL in the target');
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: { 'Content-Type': 'application/json\u0000' }, body: chatBody })), [200, 400, 415], 'NUL in Content-Type');
  });

  test('a garbage request line, a TLS hello, a bad HTTP version and a space before a header colon are refused', async (t) => {
    const wrong = [];
    // null: a clean close without a response (RFC 9112 says SHOULD answer 400; tolerated).
    for (const [what, bytes, want] of [
      ['GARBAGE', Buffer.from('GARBAGE\r\n\r\n'), [400, null]],
      ['a request line without a version', Buffer.from('GET /health\r\n\r\n'), [400, null]],
      ['a TLS hello', Buffer.from('\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n', 'latin1'), [400, null]],
      ['HTTP/9.9', Buffer.from('GET /health HTTP/9.9\r\nHost: x\r\n\r\n'), [400, 505]],
      // RFC 9112 5.1: a server MUST reject whitespace between a field name and the colon with 400.
      ['a space before the colon', Buffer.from('GET /health HTTP/1.1\r\nHost : x\r\n\r\n'), [400]],
    ]) {
      const res = await send(bytes);
      const ok = want.includes(res.firstStatus) && (res.firstStatus !== null || (res.closed && !res.timedOut && res.error === null));
      if (!ok) wrong.push(`${what}: want ${want.map((w) => w ?? 'a clean close').join(' or ')}, got ${show(res)}`);
      t.diagnostic(`${what}: ${res.firstStatus ?? (res.closed ? 'closed without a response' : 'no answer')}`);
    }
    assert.deepEqual(wrong, []);
  });
});

describe('sizes and framing', () => {
  test('a 100 MB body is answered 413 (before the server stops reading)', { timeout: 60000 * slow }, async () => {
    const total = 100 * 1024 * 1024;
    const mb = Buffer.alloc(1024 * 1024, 0x61);
    const head = Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${total}\r\n\r\n`);
    // A pause after the headers lets a server that refuses on Content-Length answer first: node
    // drops unread input when a write fails, so a 413 sent while we were still writing (then a
    // reset) would otherwise be lost here even though a real client's kernel still holds it.
    const pieces = [head, 200, Buffer.from('{"model":"m","messages":[{"role":"user","content":"'), ...Array.from({ length: 99 }, () => mb)];
    const res = await exchange(url, pieces, { timeoutMs: 45000 * slow });
    assert.equal(res.firstStatus, 413, `no 413 status line received: ${show(res)}`);
  });

  test('multi-megabyte prompts (words, and one 3 MB word) are refused 400 as longer than the context, promptly', { timeout: 60000 * slow }, async () => {
    for (const [what, content] of [['4 MB of words', 'hello world, '.repeat(300000)], ['one 3 MB word', 'x'.repeat(3000000)]]) {
      const body = JSON.stringify({ model: modelId, messages: [{ role: 'user', content }], max_tokens: 4 });
      const t0 = Date.now();
      const res = await send(request('POST', '/v1/chat/completions', { headers: json, body }), { timeoutMs: 30000 * slow });
      const err = expectOpenAIError(res, 400, what);
      const nums = (err.error.message.match(/\d+/g) || []).map(Number);
      assert.ok(nums.some((n) => n > 100000) && nums.some((n) => n > 0 && n < 100000), `${what}: the message names the prompt's length and the context: ${err.error.message}`);
      assert.ok(Date.now() - t0 < 15000 * slow, `${what}: took ${Date.now() - t0} ms`);
    }
  });

  test('a Content-Length over the limit is refused with 413 before any body is sent', async () => {
    const res = await send(Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${200 * 1024 * 1024}\r\n\r\n`));
    expectStatus(res, 413, 'Content-Length 200 MiB');
  });

  test('absurd, negative and conflicting Content-Length headers are 400s (or 413)', async () => {
    const wrong = [];
    // RFC 9112 6.3: differing Content-Length values MUST be a 400 (request smuggling).
    for (const cl of [['99999999999999999999'], ['-1'], ['12abc'], ['0x10'], ['+5'], ['5', '6'], ['5, 6']]) {
      const raw = cl.map((v) => `Content-Length: ${v}`);
      const res = await send(request('POST', '/v1/chat/completions', { headers: json, raw, body: undefined }), { timeoutMs: 5000 });
      const want = cl[0] === '99999999999999999999' ? [400, 413] : [400];
      if (!want.includes(res.firstStatus)) wrong.push(`Content-Length ${cl.join(' / ')}: want ${want.join(' or ')}, got ${show(res)}`);
    }
    assert.deepEqual(wrong, []);
  });

  test('headers of 1 MiB are refused (431, 400 or 413), not buffered forever', async () => {
    const res = await send(request('GET', '/health', { raw: [`X-Big: ${'b'.repeat(1024 * 1024)}`] }), { timeoutMs: 15000 });
    expectStatus(res, [431, 400, 413], '1 MiB header');
  });

  test('a chunked request body is read (200) or refused with 411', async (t) => {
    const b = Buffer.from(chatBody);
    const chunked = Buffer.concat([
      Buffer.from('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n'),
      Buffer.from(`${(10).toString(16)}\r\n`), b.subarray(0, 10), Buffer.from('\r\n'),
      Buffer.from(`${(b.length - 10).toString(16)}\r\n`), b.subarray(10), Buffer.from('\r\n0\r\n\r\n'),
    ]);
    const res = await send(chunked);
    expectStatus(res, [200, 411], 'chunked body');
    t.diagnostic(`chunked request body: HTTP ${res.firstStatus}`);
  });

  test('a missing body is a 400 (Content-Length 0, and no Content-Length at all)', async () => {
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: { ...json, 'Content-Length': '0' } })), 400, 'Content-Length: 0');
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: json })), [400, 411], 'no Content-Length');
  });

  test('a body shorter than its Content-Length, then a half-close, is answered 400 or closed', async () => {
    const res = await exchange(url, [Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model":`)], { halfClose: true, timeoutMs: 15000 });
    assert.ok(!res.timedOut, `the server neither answered nor closed: ${show(res)}`);
    assert.ok(res.firstStatus === null || res.firstStatus === 400, show(res));
  });
});

describe('methods, routes, content types', () => {
  test('a wrong method is a 405', async () => {
    for (const [m, path] of [['GET', '/v1/chat/completions'], ['PUT', '/v1/completions'], ['DELETE', '/v1/models'], ['POST', '/health']]) {
      const res = await send(request(m, path, m === 'GET' || m === 'DELETE' ? {} : { headers: json, body: '{}' }));
      expectStatus(res, 405, `${m} ${path}`);
    }
  });

  test('an unknown route is a 404 with an OpenAI error object', async () => {
    expectOpenAIError(await send(request('GET', '/v2/models')), 404, 'GET /v2/models');
    expectOpenAIError(await send(request('POST', '/v1/images/generations', { headers: json, body: '{}' })), 404, 'POST /v1/images/generations');
    expectOpenAIError(await send(request('GET', `/${'x'.repeat(6000)}`)), [404, 414], 'a 6000-byte path');
  });

  test('a POST that is not application/json is a 415; application/json with a charset is accepted', async (t) => {
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: { 'Content-Type': 'text/plain' }, body: chatBody })), 415, 'text/plain');
    expectOpenAIError(await send(request('POST', '/v1/chat/completions', { headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body: chatBody })), 415, 'form');
    const none = await send(request('POST', '/v1/chat/completions', { body: chatBody }));
    expectStatus(none, [415, 400, 200], 'no Content-Type');
    t.diagnostic(`POST without Content-Type: HTTP ${none.firstStatus}`);
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: { 'Content-Type': 'application/json; charset=utf-8' }, body: chatBody })), 200, 'application/json; charset=utf-8');
    expectStatus(await send(request('POST', '/v1/chat/completions', { headers: { 'Content-Type': 'Application/JSON' }, body: chatBody })), 200, 'Application/JSON (case-insensitive)');
  });
});

describe('connection handling', () => {
  test('two pipelined GET /health in one write get two responses', async () => {
    const one = request('GET', '/health');
    const res = await send(Buffer.concat([one, one]), { want: 2 });
    assert.equal(res.responses.length, 2, `pipelined: ${show(res)}`);
    assert.deepEqual(res.responses.map((r) => r.status), [200, 200]);
  });

  test('a pipelined chat POST then GET /health are answered in order', async () => {
    const res = await send(Buffer.concat([request('POST', '/v1/chat/completions', { headers: json, body: chatBody }), request('GET', '/health')]), { want: 2, timeoutMs: 20000 * slow });
    assert.deepEqual(res.responses.map((r) => r.status), [200, 200], show(res));
    assert.equal(jsonBody(res.responses[0])?.object, 'chat.completion');
    assert.deepEqual(jsonBody(res.responses[1]), { status: 'ok' });
  });

  test('Connection: close is honoured; HTTP/1.0 without Host works', async () => {
    const res = await send(request('GET', '/health', { headers: { Connection: 'close' } }), { want: 2 });
    assert.equal(res.responses[0]?.status, 200, show(res));
    assert.ok(res.closed, 'the server closes after a Connection: close request');
    const old = await send(Buffer.from('GET /health HTTP/1.0\r\n\r\n'), { want: 2 });
    assert.equal(old.responses[0]?.status, 200, show(old));
    assert.ok(old.closed, 'HTTP/1.0 without keep-alive is closed after the response');
  });

  test('a half-closed connection (request, then shutdown of the write side) still gets a response or a clean close', async (t) => {
    for (const [what, bytes] of [['GET /health', request('GET', '/health')], ['POST chat', request('POST', '/v1/chat/completions', { headers: json, body: chatBody })]]) {
      const res = await exchange(url, [bytes], { halfClose: true, timeoutMs: 20000 * slow, want: 2 });
      assert.ok(!res.timedOut, `half-closed ${what}: neither a response nor a close: ${show(res)}`);
      assert.equal(res.error, null, `half-closed ${what}: the connection was reset: ${show(res)}`);
      assert.ok(res.closed, `half-closed ${what}: not closed after the response`);
      assert.ok(res.firstStatus === null || res.responses.length === 1, `half-closed ${what}: ${show(res)}`);
      // The server may read the half-close as the client leaving and cancel (an error response).
      t.diagnostic(`half-closed ${what}: HTTP ${res.firstStatus} ${res.responses[0]?.body.toString('utf8').slice(0, 120) ?? ''}`);
    }
    const get = await exchange(url, [request('GET', '/health')], { halfClose: true, timeoutMs: 10000 });
    assert.equal(get.firstStatus, 200, `half-closed GET /health: ${show(get)}`);
  });

  test('a connection closed before sending anything, or mid-headers, leaves no trace', async () => {
    for (const bytes of [Buffer.alloc(0), Buffer.from('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le')]) {
      await new Promise((resolve) => {
        const { host, port } = hostPort(url);
        const s = net.connect({ host, port }, () => {
          s.write(bytes);
          s.destroy();
          resolve();
        });
        s.on('error', resolve);
      });
    }
    await sleep(100);
  });

  /* Waits until the generated-token counter and queue depth settle; returns the counters. */
  async function settled(ms) {
    const deadline = Date.now() + ms;
    let prev = null;
    for (;;) {
      const m = await metrics(url);
      const cur = { tokens: metricSum(m, 'inferd_generated_tokens_total'), queue: metricSum(m, 'inferd_queue_depth') };
      if (prev && prev.tokens === cur.tokens && cur.queue === 0) return cur;
      if (Date.now() > deadline) return { ...cur, unsettled: true };
      prev = cur;
      await sleep(500);
    }
  }

  /* The engine's cancelled-request count from /stats, wherever it sits; NaN when absent. */
  async function cancelledCount() {
    const stats = await (await fetch(`${url}/stats`)).json();
    const find = (o) => {
      if (!o || typeof o !== 'object') return NaN;
      if (typeof o.requests_cancelled === 'number') return o.requests_cancelled;
      for (const v of Object.values(o)) {
        const n = find(v);
        if (!Number.isNaN(n)) return n;
      }
      return NaN;
    };
    return find(stats);
  }

  test('a client that disconnects mid-stream cancels its generation and the queue drains', { timeout: 60000 * slow }, async (t) => {
    const start = await settled(5000);
    const cancelled0 = await cancelledCount();
    const maxTokens = 1800;
    const body = JSON.stringify({ model: modelId, messages: [{ role: 'user', content: 'Talk for a long time.' }], max_tokens: maxTokens, temperature: 0, stream: true });
    let chunks = 0;
    await new Promise((resolve, reject) => {
      const { host, port } = hostPort(url);
      const s = net.connect({ host, port }, () => s.write(request('POST', '/v1/chat/completions', { headers: json, body })));
      const timer = setTimeout(() => {
        s.destroy();
        reject(new Error('no stream chunks within 20 s'));
      }, 20000 * slow);
      s.on('data', (d) => {
        chunks += (d.toString('latin1').match(/data: \{/g) || []).length;
        if (chunks >= 3) {
          clearTimeout(timer);
          s.destroy();
          resolve();
        }
      });
      s.on('error', () => {});
    });
    const end = await settled(15000 * slow);
    const generated = end.tokens - start.tokens;
    t.diagnostic(`received ${chunks} chunks, then disconnected; the server generated ${generated} of ${maxTokens} tokens`);
    assert.ok(!end.unsettled, `generation still running 15 s after the disconnect: ${JSON.stringify(end)}`);
    assert.equal(end.queue, 0, 'inferd_queue_depth back to 0');
    assert.ok(generated < 200, `the generation ran on after the client left: ${generated} of ${maxTokens} tokens generated`);
    const stats = await (await fetch(`${url}/stats`)).json();
    t.diagnostic(`/stats after the disconnect: ${JSON.stringify(stats)}`);
    const cancelled1 = await cancelledCount();
    if (!Number.isNaN(cancelled0)) assert.equal(cancelled1 - cancelled0, 1, '/stats counts the cancelled request');
  });

  test('a client that disconnects while waiting for a non-streaming answer cancels it too', { timeout: 60000 * slow }, async (t) => {
    const start = await settled(5000);
    const maxTokens = 1800;
    const body = JSON.stringify({ model: modelId, messages: [{ role: 'user', content: 'Talk for a long time.' }], max_tokens: maxTokens, temperature: 0 });
    await exchange(url, [request('POST', '/v1/chat/completions', { headers: json, body }), 300], { timeoutMs: 400 });
    const end = await settled(15000 * slow);
    const generated = end.tokens - start.tokens;
    t.diagnostic(`the server generated ${generated} of ${maxTokens} tokens for a client gone after 0.3 s`);
    assert.ok(!end.unsettled, `generation still running 15 s after the disconnect: ${JSON.stringify(end)}`);
    assert.ok(generated < maxTokens, `ran to completion (${generated} tokens) for a client that had left`);
  });
});

describe('slow clients', () => {
  test(`slow headers (one byte a second) and idle connections are timed out by the server, while others are served`, { timeout: (SLOWLORIS_LIMIT_S + 30) * 1000 }, async (t) => {
    // Meanwhile: every other test in this file ran with these connections open.
    await assertServing(url);
    const results = await slowloris;
    const worst = Math.max(...results.map((r) => r.closedAfterS));
    t.diagnostic(`slow connections closed by the server after ${results.map((r) => r.closedAfterS.toFixed(1)).join(', ')} s (statuses ${[...new Set(results.map((r) => r.status))].join(', ')})`);
    const open = results.filter((r) => !r.closedByServer);
    assert.equal(open.length, 0, `${open.length} of ${results.length} slow connections were still open after ${SLOWLORIS_LIMIT_S} s`);
    assert.ok(worst < SLOWLORIS_LIMIT_S);
  });
});

describe('prefix-cache identity fields', () => {
  const long = 'x'.repeat(300);
  for (const field of ['session_id', 'prompt_cache_key', 'cache_salt']) {
    for (const [what, value] of [['a number', 42], ['an object', { id: 'a' }], ['an empty string', ''], ['300 bytes', long]]) {
      test(`${field} as ${what} is a 400 naming the field, on both routes`, async () => {
        for (const [route, base] of [['/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }], ['/v1/completions', { prompt: 'hi' }]]) {
          const body = JSON.stringify({ model: modelId, ...base, max_tokens: 2, [field]: value });
          const res = await send(request('POST', route, { headers: json, body }));
          const err = expectOpenAIError(res, 400, `${route} ${field} ${what}`);
          assert.equal(err.error.param, field, JSON.stringify(err));
        }
      });
    }
  }

  test('a session header of 300 bytes or an empty one is a 400 naming the header', async () => {
    for (const header of ['x-session-affinity', 'session_id']) {
      for (const value of [long, '']) {
        const res = await send(request('POST', '/v1/chat/completions', { headers: { ...json, [header]: value }, body: chatBody }));
        const err = expectOpenAIError(res, 400, `${header}: ${value.length} bytes`);
        assert.equal(err.error.param, header, JSON.stringify(err));
      }
    }
  });

  test('valid identity fields of 256 bytes are served', async () => {
    const v = 'k'.repeat(256);
    const body = JSON.stringify({ model: modelId, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, session_id: v, prompt_cache_key: v, cache_salt: v });
    const res = await send(request('POST', '/v1/chat/completions', { headers: json, body }));
    expectStatus(res, 200, 'identity fields of 256 bytes');
  });
});

describe('Anthropic Messages (/v1/messages)', () => {
  /* {"type":"error","error":{"type":...,"message":...}} with the given status and type. */
  const expectAnthropicError = (res, status, type, what) => {
    expectStatus(res, status, what);
    const body = jsonBody(res.responses[0]);
    assert.ok(body && body.type === 'error' && typeof body.error === 'object' && body.error.type === type &&
      typeof body.error.message === 'string' && body.error.message.length > 0,
      `${what}: not an Anthropic ${type} error: ${res.responses[0].body.toString('utf8').slice(0, 300)}`);
    return body;
  };
  const messages = [{ role: 'user', content: 'hi' }];
  const post = (body, route = '/v1/messages') =>
    send(request('POST', route, { headers: json, body: typeof body === 'string' ? body : JSON.stringify(body) }));

  test('malformed JSON (truncated, trailing garbage, not an object, empty) is a 400 invalid_request_error', async () => {
    for (const body of ['{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hel', `{"max_tokens":2,"messages":[]} x`, '[1]', '"text"', 'null', '']) {
      expectAnthropicError(await post(body), 400, 'invalid_request_error', JSON.stringify(body.slice(0, 40)));
    }
  });

  test('wrong types and a missing max_tokens are 400s whose message names the field', async () => {
    const cases = [
      [{ model: modelId, messages }, 'max_tokens'],
      [{ model: modelId, max_tokens: '2', messages }, 'max_tokens'],
      [{ model: modelId, max_tokens: 2, messages: 'hi' }, 'messages'],
      [{ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: 5 }] }, 'messages[0].content'],
      [{ model: modelId, max_tokens: 2, messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role'],
      [{ model: modelId, max_tokens: 2, system: 7, messages }, 'system'],
      [{ model: modelId, max_tokens: 2, temperature: 'hot', messages }, 'temperature'],
      [{ model: modelId, max_tokens: 2, stop_sequences: 'END', messages }, 'stop_sequences'],
      [{ model: modelId, max_tokens: 2, tools: [{ name: 'f' }], messages }, 'tools[0].input_schema'],
      [{ model: modelId, max_tokens: 2, tool_choice: { type: 'any' }, messages }, 'tool_choice.type'],
      [{ model: modelId, max_tokens: 2, thinking: { type: 'enabled', budget_tokens: 2 }, messages }, 'thinking.budget_tokens'],
      [{ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'f', input: {} }] }] }, 'messages[1].content[0].id'],
      [{ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'nope', content: 'r' }] }] }, 'messages[0].content[0].tool_use_id'],
    ];
    for (const [body, field] of cases) {
      const err = expectAnthropicError(await post(body), 400, 'invalid_request_error', field);
      assert.ok(err.error.message.includes(field), `${field}: message ${JSON.stringify(err.error.message)}`);
    }
  });

  test('an image block is a 400 saying this model does not support it; an unknown block type is a 400', async () => {
    const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } };
    let err = expectAnthropicError(await post({ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: [image] }] }), 400, 'invalid_request_error', 'image');
    assert.match(err.error.message, /messages\[0\]\.content\[0\]\.type.*image.*not supported by this model/);
    err = expectAnthropicError(await post({ model: modelId, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'hologram', text: 'x' }] }] }), 400, 'invalid_request_error', 'unknown block');
    assert.match(err.error.message, /messages\[0\]\.content\[0\]\.type/);
  });

  test('count_tokens refuses the same bad input in the same shape; a wrong method is a 405 in that shape', async () => {
    expectAnthropicError(await post('{"messages":', '/v1/messages/count_tokens'), 400, 'invalid_request_error', 'count_tokens truncated');
    expectAnthropicError(await post({ model: modelId, messages: [{ role: 'user', content: [{ type: 'image' }] }] }, '/v1/messages/count_tokens'), 400, 'invalid_request_error', 'count_tokens image');
    expectAnthropicError(await send(request('GET', '/v1/messages')), 405, 'invalid_request_error', 'GET /v1/messages');
  });

  test('an unknown /v1 route keeps the OpenAI error shape', async () => {
    expectOpenAIError(await send(request('POST', '/v1/messages/batches', { headers: json, body: '{}' })), 404, 'unknown route');
  });
});

describe('/v1/responses', () => {
  const post = (body) => send(request('POST', '/v1/responses', { headers: json, body }));

  test('malformed JSON (truncated, trailing garbage, not an object, empty) is a 400 error object', async () => {
    for (const body of ['{"model":"m","input":"hel', '{"input":"hi"} x', '"hi"', '[{"input":"hi"}]', 'null', '']) {
      expectOpenAIError(await post(body), 400, JSON.stringify(body.slice(0, 40)));
    }
  });

  test('wrong types are 400s naming the field', async () => {
    const cases = [
      [{ input: 5 }, 'input'],
      [{ input: [{ role: 'user', content: 7 }] }, 'input[0].content'],
      [{ input: [{ role: 'robot', content: 'hi' }] }, 'input[0].role'],
      [{ input: 'hi', max_output_tokens: '8' }, 'max_output_tokens'],
      [{ input: 'hi', max_output_tokens: 0 }, 'max_output_tokens'],
      [{ input: 'hi', temperature: 'hot' }, 'temperature'],
      [{ input: 'hi', store: 'yes' }, 'store'],
      [{ input: 'hi', instructions: ['a'] }, 'instructions'],
      [{ input: 'hi', metadata: { k: 1 } }, 'metadata.k'],
      [{ input: 'hi', tools: [{ type: 'function' }] }, 'tools[0].name'],
      [{ input: 'hi', tool_choice: 'always' }, 'tool_choice'],
      [{ input: 'hi', reasoning: { effort: 'max' } }, 'reasoning.effort'],
      [{ input: 'hi', previous_response_id: 42 }, 'previous_response_id'],
      [{ input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: { a: 1 } }] }, 'input[0].arguments'],
    ];
    for (const [fields, param] of cases) {
      const err = expectOpenAIError(await post(JSON.stringify({ model: modelId, ...fields })), 400, JSON.stringify(fields));
      assert.equal(err.error.param, param, JSON.stringify(err));
    }
  });

  test('an unknown item type, an output for no call and an input_image are 4xx naming them', async () => {
    const cases = [
      [[{ type: 'computer_call', id: 'x' }], 'input[0].type', 400],
      [[{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] }], 'input[0].content[0].type', 400],
      [[{ role: 'user', content: 'hi' }, { type: 'function_call_output', call_id: 'call_nowhere', output: 'x' }], 'input[1].call_id', 400],
    ];
    for (const [input, param, status] of cases) {
      const err = expectOpenAIError(await post(JSON.stringify({ model: modelId, input, max_output_tokens: 2 })), status, param);
      assert.equal(err.error.param, param, JSON.stringify(err));
    }
  });

  test('an unknown previous_response_id is a 404; ids with odd bytes or lengths are answered, not a crash', async () => {
    const err = expectOpenAIError(await post(JSON.stringify({ input: 'hi', previous_response_id: 'resp_nope' })), 404, 'unknown id');
    assert.equal(err.error.param, 'previous_response_id');
    expectOpenAIError(await post(JSON.stringify({ input: 'hi', previous_response_id: 'r'.repeat(5000) })), 400, 'a 5000-byte id');
    for (const id of ['resp_%00', 'r'.repeat(5000), 'a/b', '%2e%2e']) {
      const res = await send(request('GET', `/v1/responses/${id}`));
      expectStatus(res, [404, 400], `GET ${id.slice(0, 20)}`);
      const del = await send(request('DELETE', `/v1/responses/${id}`));
      expectStatus(del, [404, 400], `DELETE ${id.slice(0, 20)}`);
    }
  });

  test('a wrong method on the responses routes is a 405', async () => {
    expectStatus(await send(request('GET', '/v1/responses')), 405, 'GET /v1/responses');
    expectStatus(await send(request('POST', '/v1/responses/resp_x', { headers: json, body: '{}' })), 405, 'POST /v1/responses/{id}');
  });
});
