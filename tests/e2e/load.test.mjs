// tests/e2e/load.test.mjs — 64 concurrent streaming chat clients for a bounded time: every stream ends in [DONE], no errors, no unbounded memory growth.
//
// Two equal rounds; the server's RSS is read from /proc after a warm-up and after each round,
// and the second round may not grow it by more than a small allowance (caches are warm by then).
// INFERD_E2E_LOAD_CLIENTS and INFERD_E2E_LOAD_SECONDS (per round) size it; the sanitizer run
// uses a short version, where LeakSanitizer stands in for the RSS check.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { metrics, metricSum, modelId, rssKiB, sanitize, sleep, sseRequest, useMainServer } from './lib/harness.mjs';

const CLIENTS = Number(process.env.INFERD_E2E_LOAD_CLIENTS || 64);
const ROUND_S = Number(process.env.INFERD_E2E_LOAD_SECONDS || (sanitize ? 3 : 10));
const MIN_TOKENS = sanitize ? 4 : 16;
const MAX_TOKENS = sanitize ? 8 : 32;
/* RSS growth allowed over the second round: 16 MiB or 10 %, whichever is larger. */
const GROWTH_KIB = (rss) => Math.max(16 * 1024, rss / 10);

let server;
let openai;

useMainServer((s, c) => {
  server = s;
  openai = c;
});

const prompts = ['Tell me a story.', 'List some colours.', 'What is 2+2?', 'Describe the sea.', 'Write a haiku about rain.', 'Name three rivers.'];

/* One streamed chat over plain fetch, checked event by event; returns completion tokens. */
async function rawStream(i, n, maxTokens) {
  const r = await sseRequest(server.url, '/v1/chat/completions', {
    model: modelId, messages: [{ role: 'user', content: prompts[(i + n) % prompts.length] }], max_tokens: maxTokens, temperature: 0.8, seed: i * 1000 + n, stream: true, stream_options: { include_usage: true },
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${r.raw.slice(0, 300)}`);
  if (!r.done) throw new Error(`stream did not end with data: [DONE] (tail ${JSON.stringify(r.raw.slice(-120))})`);
  if (r.events.indexOf('[DONE]') !== r.events.length - 1) throw new Error('data after [DONE]');
  const finish = r.chunks.filter((c) => c.choices?.[0]?.finish_reason).map((c) => c.choices[0].finish_reason);
  if (finish.length !== 1) throw new Error(`${finish.length} finish_reason chunks`);
  const usage = r.chunks.at(-1).usage;
  if (!usage || r.chunks.at(-1).choices.length !== 0) throw new Error('no usage chunk before [DONE]');
  if (usage.completion_tokens > maxTokens || (finish[0] === 'length' && usage.completion_tokens !== maxTokens)) {
    throw new Error(`completion_tokens ${usage.completion_tokens} with max_tokens ${maxTokens}, finish ${finish[0]}`);
  }
  return usage.completion_tokens;
}

/* The same through the SDK's stream iterator. */
async function sdkStream(i, n, maxTokens) {
  const stream = await openai.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: prompts[(i + n) % prompts.length] }], max_tokens: maxTokens, temperature: 0.8, seed: i * 1000 + n, stream: true, stream_options: { include_usage: true },
  });
  let usage = null;
  let finish = null;
  for await (const ch of stream) {
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    if (ch.usage) usage = ch.usage;
  }
  if (!finish || !usage) throw new Error(`SDK stream without finish_reason (${finish}) or usage`);
  return usage.completion_tokens;
}

/* CLIENTS loops of streamed requests until the round's end; returns counts and errors. */
async function round(seconds) {
  const t0 = Date.now();
  const endAt = t0 + seconds * 1000;
  const errors = [];
  let streams = 0;
  let tokens = 0;
  let healthWorstMs = 0;
  let running = true;
  const healthProbe = (async () => {
    while (running) {
      const t0 = Date.now();
      const r = await fetch(`${server.url}/health`).catch((e) => ({ status: String(e) }));
      healthWorstMs = Math.max(healthWorstMs, Date.now() - t0);
      if (r.status !== 200) errors.push(`GET /health during load: ${r.status}`);
      await sleep(250);
    }
  })();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, i) => {
    for (let n = 0; Date.now() < endAt; n++) {
      const maxTokens = MIN_TOKENS + ((i * 7 + n * 13) % (MAX_TOKENS - MIN_TOKENS + 1));
      try {
        const got = await (i % 2 ? sdkStream(i, n, maxTokens) : rawStream(i, n, maxTokens));
        tokens += got;
        streams++;
      } catch (e) {
        errors.push(`client ${i} request ${n}: ${e?.constructor?.name} ${e?.status ?? ''} ${e?.message}`);
      }
    }
  }));
  running = false;
  await healthProbe;
  return { streams, tokens, errors, healthWorstMs, seconds: (Date.now() - t0) / 1000 };
}

test(`${CLIENTS} concurrent streaming chat clients, two rounds of ${ROUND_S} s: every stream ends in [DONE], no errors, RSS bounded`, { timeout: (ROUND_S * 2 + 120) * 1000 * (sanitize ? 3 : 1) }, async (t) => {
  await Promise.all(Array.from({ length: 8 }, (_, i) => rawStream(i, 0, 8)));
  const m0 = await metrics(server.url);
  const rss0 = rssKiB(server.pid);
  const r1 = await round(ROUND_S);
  await sleep(500);
  const rss1 = rssKiB(server.pid);
  const cache1 = metricSum(await metrics(server.url), 'inferd_prompt_cache_bytes');
  const r2 = await round(ROUND_S);
  await sleep(500);
  const rss2 = rssKiB(server.pid);
  const m1 = await metrics(server.url);
  // The prefix cache keeps what the streams computed, up to --prompt-cache: its growth is
  // memory in use by design, the rest must stay flat.
  const cacheGrowthKiB = Math.max(0, metricSum(m1, 'inferd_prompt_cache_bytes') - cache1) / 1024;

  const line = (name, r) => `${name}: ${r.streams} streams, ${r.tokens} tokens in ${r.seconds.toFixed(1)} s with the drain (${(r.tokens / r.seconds).toFixed(0)} tok/s), ${r.errors.length} errors, slowest /health ${r.healthWorstMs} ms`;
  t.diagnostic(line('round 1', r1));
  t.diagnostic(line('round 2', r2));
  t.diagnostic(server.pid ? `server RSS: ${(rss0 / 1024).toFixed(1)} MiB after warm-up, ${(rss1 / 1024).toFixed(1)} MiB after round 1, ${(rss2 / 1024).toFixed(1)} MiB after round 2` : 'server pid unknown: RSS not measured');

  const errors = [...r1.errors, ...r2.errors];
  assert.deepEqual(errors.slice(0, 10), [], `${errors.length} errors under load`);
  assert.ok(r1.streams >= CLIENTS && r2.streams >= CLIENTS, 'every client finished at least one stream per round');
  // Under AddressSanitizer freed memory sits in its quarantine, so RSS says little; LeakSanitizer
  // (at the server's exit, checked by run.sh) covers leaks there instead.
  if (server.pid && !sanitize) {
    assert.ok(rss0 > 0 && rss1 > 0 && rss2 > 0, 'RSS readable');
    const allowed = GROWTH_KIB(rss1) + cacheGrowthKiB;
    assert.ok(rss2 - rss1 <= allowed, `RSS grew by ${((rss2 - rss1) / 1024).toFixed(1)} MiB over the second round (allowed ${(allowed / 1024).toFixed(1)} MiB, ${(cacheGrowthKiB / 1024).toFixed(1)} MiB of it the prefix cache's growth)`);
  }
  const queue = metricSum(m1, 'inferd_queue_depth');
  assert.equal(queue, 0, 'inferd_queue_depth is 0 after the load');
  const generated = metricSum(m1, 'inferd_generated_tokens_total') - metricSum(m0, 'inferd_generated_tokens_total');
  assert.equal(generated, r1.tokens + r2.tokens, 'inferd_generated_tokens_total moved by the streams\' completion tokens');
  const chat200 = [...m1].filter(([k]) => k.startsWith('inferd_requests_total{') && k.includes('route="/v1/chat/completions"') && k.includes('status="200"')).reduce((s, [, v]) => s + v, 0)
    - [...m0].filter(([k]) => k.startsWith('inferd_requests_total{') && k.includes('route="/v1/chat/completions"') && k.includes('status="200"')).reduce((s, [, v]) => s + v, 0);
  assert.equal(chat200, r1.streams + r2.streams, 'inferd_requests_total{route="/v1/chat/completions",status="200"} counted every stream');
});
