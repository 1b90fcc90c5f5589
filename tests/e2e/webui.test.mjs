// tests/e2e/webui.test.mjs — the chat page at / in a real headless Chromium (Debian's, driven by
// puppeteer-core) against `inferd serve models/house --api-key …`, and WS /ws/chat with the `ws`
// package: the page's headers, the key prompt, streaming, Stop (the server counts a
// cancellation), reload, the reasoning fold-out and thinking switch, model output that tries to
// run script, console errors, requests to other origins; screenshots at desktop and phone width.
//
// Without /usr/bin/chromium (INFERD_E2E_CHROMIUM picks another) the browser tests are skipped
// with a message, except under CI=true, where that is a failure. Screenshots go to
// INFERD_E2E_ARTIFACTS (default build/e2e-artifacts).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { metricSum, parseMetrics, sleep, slow, startServer } from './lib/harness.mjs';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const houseModel = path.join(repoRoot, 'models/house');
const chromiumPath = process.env.INFERD_E2E_CHROMIUM || '/usr/bin/chromium';
const haveChromium = fs.existsSync(chromiumPath);
const artifacts = path.resolve(repoRoot, process.env.INFERD_E2E_ARTIFACTS || 'build/e2e-artifacts');
const KEY = 'webui-test-key';
const auth = { Authorization: `Bearer ${KEY}` };
// The house model's end-of-turn and end-of-text ids: banned, an answer runs to max_tokens.
const NO_EOS = { 0: -100, 2: -100 };
const WAIT = 30000 * slow;

if (!haveChromium && process.env.CI === 'true') {
  test('chromium is installed (scripts/bootstrap.sh installs Debian\'s)', () => {
    assert.fail(`no Chromium at ${chromiumPath}: the browser tests cannot run under CI`);
  });
}
if (!haveChromium && process.env.CI !== 'true')
  console.log(`webui: no Chromium at ${chromiumPath} (scripts/bootstrap.sh installs it); the browser tests are skipped`);

// A canned Server-Sent Events answer, as /v1/chat/completions streams one.
function sse(deltas, finish = 'stop') {
  const chunk = (delta, finish_reason = null) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-canned', object: 'chat.completion.chunk', created: 0, model: 'house', choices: [{ index: 0, delta, logprobs: null, finish_reason }] })}\n\n`;
  let body = chunk({ role: 'assistant', content: '' });
  for (const d of deltas) body += chunk(d);
  body += chunk({}, finish);
  body += `data: ${JSON.stringify({ id: 'chatcmpl-canned', object: 'chat.completion.chunk', created: 0, model: 'house', choices: [], usage: { prompt_tokens: 5, completion_tokens: deltas.length, total_tokens: 5 + deltas.length, prompt_tokens_details: { cached_tokens: 0 } } })}\n\n`;
  return `${body}data: [DONE]\n\n`;
}

describe('the chat page and WS /ws/chat', { skip: !haveChromium && process.env.CI !== 'true' }, () => {
  let server, browser, page;
  const consoleErrors = [];
  const foreignRequests = [];
  const chatBodies = [];
  // What the next POST /v1/chat/completions gets: null goes to the server; {extend} goes to the
  // server with those fields added; {respond} is answered with that SSE body.
  let nextChat = null;

  before(async () => {
    server = await startServer(['--api-key', KEY], { name: `webui-${process.pid}`, model: houseModel });
    const { default: puppeteer } = await import('puppeteer-core');
    browser = await puppeteer.launch({
      executablePath: chromiumPath,
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
    });
    page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 800 });
    page.on('console', (m) => {
      // The page's first call learns that a key is needed from a 401, which Chromium reports.
      if (m.type() === 'error' && !/status of 401/.test(m.text())) consoleErrors.push(m.text());
    });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    await page.setRequestInterception(true);
    page.on('request', (req) => {
      const url = req.url();
      if (!url.startsWith(server.url) && !url.startsWith('data:') && !url.startsWith('blob:')) foreignRequests.push(url);
      if (req.method() === 'POST' && url.endsWith('/v1/chat/completions')) {
        const body = JSON.parse(req.postData() || '{}');
        chatBodies.push(body);
        const plan = nextChat;
        nextChat = null;
        if (plan?.respond) return req.respond({ status: 200, contentType: 'text/event-stream', body: plan.respond });
        if (plan?.extend) return req.continue({ postData: JSON.stringify({ ...body, ...plan.extend }) });
      }
      return req.continue();
    });
    fs.mkdirSync(artifacts, { recursive: true });
  });

  after(async () => {
    await browser?.close();
    if (server) {
      const r = await server.stop();
      assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}`);
    }
  });

  // Generations the engine cancelled so far (GET /metrics, which needs the key).
  async function cancelled() {
    const r = await fetch(`${server.url}/metrics`, { headers: auth });
    assert.equal(r.status, 200);
    return metricSum(parseMetrics(await r.text()), 'inferd_requests_cancelled_total');
  }

  async function cancelledAbove(n) {
    let now = await cancelled();
    for (const deadline = Date.now() + WAIT; now <= n && Date.now() < deadline; await sleep(100)) now = await cancelled();
    return now;
  }

  async function send(text) {
    // A click, as a person would (headless Chromium types nowhere after a modal dialog closed
    // when focus is only set by script).
    await page.click('textarea');
    await page.keyboard.type(text);
    await page.keyboard.press('Enter');
  }

  // Waits for answer number n (1-based) to be done; its finish and text.
  async function answerDone(n) {
    await page.waitForFunction(
      (n) => document.querySelectorAll('article.assistant')[n - 1]?.dataset.done === 'true',
      { timeout: WAIT },
      n,
    );
    return page.evaluate((n) => {
      const a = document.querySelectorAll('article.assistant')[n - 1];
      return { finish: a.dataset.finish, text: a.querySelector('.body').textContent, meta: a.querySelector('.meta').textContent, html: a.querySelector('.body').innerHTML };
    }, n);
  }

  test('GET / is the page: CSP, ETag and 304, gzip, its icon; /ws/chat without an upgrade is 426', async () => {
    const r = await fetch(`${server.url}/`, { headers: { 'accept-encoding': 'identity' } });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    const csp = r.headers.get('content-security-policy');
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'self'(;|$)/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/);
    assert.equal(r.headers.get('cache-control'), 'no-cache');
    const etag = r.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{16}"$/);
    assert.match(await r.text(), /<textarea/);
    const again = await fetch(`${server.url}/`, { headers: { 'if-none-match': etag, 'accept-encoding': 'identity' } });
    assert.equal(again.status, 304);
    const js = await fetch(`${server.url}/assets/app.js`, { headers: { 'accept-encoding': 'gzip' } });
    assert.equal(js.status, 200);
    assert.equal(js.headers.get('content-encoding'), 'gzip');
    assert.ok((await js.text()).length > 1000, 'the bundle decompresses');
    assert.equal((await fetch(`${server.url}/favicon.ico`)).status, 200);
    assert.equal((await fetch(`${server.url}/assets/nothing.js`)).status, 404);
    const ws = await fetch(`${server.url}/ws/chat`, { headers: auth });
    assert.equal(ws.status, 426);
    assert.equal(await ws.text(), 'expected websocket');
    assert.equal((await fetch(`${server.url}/ws/chat`)).status, 401, 'the socket needs the key too');
  });

  test('the page asks for the API key and keeps it for the session only', async () => {
    await page.goto(`${server.url}/`, { waitUntil: 'load' });
    await page.waitForSelector('#key-dialog[open]', { timeout: WAIT });
    await page.type('#api-key', KEY);
    await page.click('#key-ok');
    await page.waitForFunction(() => document.getElementById('model').textContent === 'house', { timeout: WAIT });
    const stored = await page.evaluate(() => [sessionStorage.getItem('inferd.apiKey'), localStorage.getItem('inferd.apiKey')]);
    assert.deepEqual(stored, [KEY, null]);
    assert.equal(await page.$eval('textarea', (t) => t.id), 'prompt', 'the message box is the first textarea');
  });

  test('an answer streams into the page before it ends, with its numbers', async () => {
    nextChat = { extend: { logit_bias: NO_EOS, max_tokens: 400 } };
    await send('Tell me a long story.');
    // Text shows while the answer is still streaming (Stop still offered).
    await page.waitForFunction(() => {
      const a = document.querySelector('article.assistant');
      return a && a.dataset.streaming === 'true' && a.querySelector('.body').textContent.length > 0 && !document.getElementById('stop').hidden;
    }, { timeout: WAIT, polling: 'mutation' });
    const done = await answerDone(1);
    assert.equal(done.finish, 'length');
    assert.ok(done.text.length > 0);
    assert.match(done.meta, /400 tokens/);
    assert.match(done.meta, /tok\/s/);
    assert.match(done.meta, /first token \d+ ms/);
    assert.match(done.meta, /cached_tokens \d+/);
    const body = chatBodies.at(-1);
    assert.equal(body.stream, true);
    assert.equal(body.messages.at(-1).content, 'Tell me a long story.');
  });

  test('Stop ends a long answer mid-stream and the server counts a cancellation', async () => {
    const before = await cancelled();
    nextChat = { extend: { logit_bias: NO_EOS, max_tokens: 100000 } };
    await send('Go on, at length.');
    await page.waitForFunction(() => document.querySelectorAll('article.assistant')[1]?.querySelector('.body').textContent.length > 0, { timeout: WAIT, polling: 'mutation' });
    await page.click('#stop');
    const done = await answerDone(2);
    assert.equal(done.finish, 'stopped');
    const now = await cancelledAbove(before);
    assert.ok(now > before, `inferd_requests_cancelled_total went from ${before} to ${now}`);
    assert.equal(await page.$eval('#stop', (b) => b.hidden), true);
  });

  test('a reload finds the conversation in localStorage', async () => {
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelectorAll('article.message').length === 4, { timeout: WAIT });
    const texts = await page.$$eval('article.user .body', (b) => b.map((x) => x.textContent));
    assert.deepEqual(texts, ['Tell me a long story.', 'Go on, at length.']);
    const titles = await page.$$eval('#conversations .open-chat', (b) => b.map((x) => x.textContent));
    assert.ok(titles.includes('Tell me a long story.'), JSON.stringify(titles));
    await page.screenshot({ path: path.join(artifacts, 'webui-desktop.png') });
  });

  test('thinking on sends enable_thinking and shows the reasoning folded; off sends false', async () => {
    await page.click('#new-chat');
    await page.click('#toggle-settings');
    await page.click('#thinking');
    nextChat = {
      respond: sse([{ reasoning_content: 'First I weigh ', reasoning: 'First I weigh ' }, { reasoning_content: 'the question.', reasoning: 'the question.' }, { content: 'The **answer**.' }]),
    };
    await send('Think first.');
    const done = await answerDone(1);
    assert.equal(done.text.trim(), 'The answer.');
    assert.match(done.html, /<strong>answer<\/strong>/);
    assert.equal(chatBodies.at(-1).chat_template_kwargs.enable_thinking, true);
    const fold = await page.$eval('article.assistant details.reasoning', (d) => ({ hidden: d.hidden, open: d.open, text: d.querySelector('.reasoning-text').textContent }));
    assert.deepEqual(fold, { hidden: false, open: false, text: 'First I weigh the question.' });
    await page.click('article.assistant details.reasoning summary');
    assert.equal(await page.$eval('article.assistant details.reasoning', (d) => d.open), true);
    await page.click('#thinking');
    nextChat = { extend: { max_tokens: 8 } };
    await send('Now without.');
    await answerDone(2);
    assert.equal(chatBodies.at(-1).chat_template_kwargs.enable_thinking, false);
    assert.equal(await page.$$eval('article.assistant', (a) => a[1].querySelector('details.reasoning').hidden), true);
    await page.click('#toggle-settings');
  });

  test('model output with script, onerror images and javascript: links executes nothing', async () => {
    await page.click('#new-chat');
    const evil = [
      { content: 'Hello <script>window.__pwned = "script"</script>\n\n' },
      { content: '<img src=x onerror="window.__pwned = \'img\'">\n\n' },
      { content: '[click me](javascript:window.__pwned=\'link\') and <a href="javascript:window.__pwned=\'a\'">this</a>\n\n' },
      { content: '<iframe src="javascript:parent.__pwned=\'iframe\'"></iframe><svg onload="window.__pwned=\'svg\'"></svg>\n\n' },
      { content: '```js\nconst x = "<script>alert(1)</script>";\n```\n' },
    ];
    nextChat = {
      respond: sse([...evil, { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] }], 'tool_calls'),
    };
    await send('<img src=x onerror="window.__pwned=\'user\'"> what now?');
    const done = await answerDone(1);
    assert.equal(done.finish, 'tool_calls');
    await sleep(200);
    const found = await page.evaluate(() => {
      const a = document.querySelector('article.assistant .body');
      return {
        pwned: window.__pwned,
        scripts: document.querySelectorAll('#messages script').length,
        handlers: [...document.querySelectorAll('#messages *')].filter((e) => [...e.attributes].some((x) => x.name.startsWith('on'))).length,
        jsLinks: [...document.querySelectorAll('#messages a')].filter((l) => /^\s*javascript:/i.test(l.getAttribute('href') || '')).length,
        frames: document.querySelectorAll('#messages iframe').length,
        code: a.querySelector('pre code')?.textContent,
        userText: document.querySelector('article.user .body').textContent,
        tool: document.querySelector('article.assistant .tool-call')?.textContent,
      };
    });
    assert.equal(found.pwned, undefined);
    assert.equal(found.scripts, 0);
    assert.equal(found.handlers, 0);
    assert.equal(found.jsLinks, 0);
    assert.equal(found.frames, 0);
    assert.match(found.code, /<script>alert\(1\)<\/script>/, 'code shows as text');
    assert.match(done.text, /<img src=x onerror=/, 'HTML in the reply shows as the text it is');
    assert.match(found.userText, /<img src=x onerror/, 'the user\'s own text shows as typed');
    assert.match(found.tool, /Tool call: get_weather/);
    assert.match(found.tool, /"city":"Oslo"/);
    // Clicking what is left of the links runs nothing either.
    for (const a of await page.$$('#messages article.assistant a')) await a.click().catch(() => {});
    await sleep(200);
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
  });

  test('the server panel shows /stats while open', async () => {
    await page.click('#toggle-stats');
    await page.waitForFunction(() => document.querySelectorAll('#stats-list dt').length > 0, { timeout: WAIT });
    const labels = await page.$$eval('#stats-list dt', (d) => d.map((x) => x.textContent));
    for (const want of ['Cache hit rate', 'Cached bytes', 'KV blocks in use', 'Queue depth']) assert.ok(labels.includes(want), want);
    await page.screenshot({ path: path.join(artifacts, 'webui-server-panel.png') });
    await page.click('#toggle-stats');
  });

  test('phone width: the chat fills the screen', async () => {
    await page.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector('article.assistant', { timeout: WAIT });
    const widths = await page.evaluate(() => ({ chat: document.getElementById('chat').getBoundingClientRect().width, sidebar: getComputedStyle(document.getElementById('sidebar')).display }));
    assert.ok(widths.chat >= 380, JSON.stringify(widths));
    assert.equal(widths.sidebar, 'none');
    await page.screenshot({ path: path.join(artifacts, 'webui-phone.png') });
    await page.setViewport({ width: 1280, height: 800 });
  });

  test('no console errors and no requests to other origins', () => {
    assert.deepEqual(consoleErrors, []);
    assert.deepEqual(foreignRequests, []);
  });

  test('WS /ws/chat: ready frame, a streamed turn, an abort the server counts', async () => {
    const ws = new WebSocket(`${server.url.replace(/^http/, 'ws')}/ws/chat`, { headers: auth });
    const frames = [];
    let wake = () => {};
    ws.on('message', (d) => {
      frames.push(JSON.parse(d.toString()));
      wake();
    });
    const closed = new Promise((r) => ws.on('close', (code) => r(code)));
    const until = async (pred) => {
      const deadline = Date.now() + WAIT;
      for (;;) {
        const f = frames.find(pred);
        if (f) return f;
        if (Date.now() > deadline) throw new Error(`no such frame in ${JSON.stringify(frames).slice(0, 2000)}`);
        await new Promise((r) => { wake = r; setTimeout(r, 200); });
      }
    };
    const ready = await until((f) => f.type === 'ready');
    assert.equal(ready.model, 'house');
    assert.equal(typeof ready.thinking, 'boolean');
    assert.equal(ready.vision, false);
    assert.equal(typeof ready.genDefaults.temperature, 'number');

    ws.send(JSON.stringify({ type: 'prompt', message: 'Hello there.', max_tokens: 6, logit_bias: NO_EOS }));
    const end = await until((f) => f.type === 'agent_end');
    assert.equal(end.finish_reason, 'length');
    assert.equal(end.usage.completion_tokens, 6);
    const text = frames.filter((f) => f.type === 'message_update' && f.assistantMessageEvent.type === 'text_delta').map((f) => f.assistantMessageEvent.delta).join('');
    assert.ok(text.length > 0);
    assert.ok(frames.findIndex((f) => f.type === 'agent_start') < frames.findIndex((f) => f.type === 'message_update'));

    const cancelledBefore = await cancelled();
    frames.length = 0;
    ws.send(JSON.stringify({ type: 'prompt', message: 'Now at length.', max_tokens: 100000, logit_bias: NO_EOS }));
    await until((f) => f.type === 'message_update');
    ws.send(JSON.stringify({ type: 'abort' }));
    const aborted = await until((f) => f.type === 'agent_end');
    assert.equal(aborted.finish_reason, 'aborted');
    const cancelledAfter = await cancelledAbove(cancelledBefore);
    assert.ok(cancelledAfter > cancelledBefore, `cancelled ${cancelledBefore} -> ${cancelledAfter}`);

    frames.length = 0;
    ws.send('not json');
    assert.equal((await until((f) => f.type === 'error')).status, 400);
    ws.send(JSON.stringify({ type: 'new_session' }));
    await until((f) => f.type === 'new_session');
    ws.close(1000);
    assert.equal(await closed, 1000);
  });
});
