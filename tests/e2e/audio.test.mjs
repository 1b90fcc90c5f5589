// tests/e2e/audio.test.mjs — /v1/audio/transcriptions and /translations through the official openai SDK against a server with a random-weight Whisper model (mkmodel --preset whisper-test): every response_format's shape, the streaming events sent as decoded (and a disconnect cancelling), beam search, word timestamps, the Whisper options, JSON bodies, dictation sessions, VAD chunking, bad input as 4xx, and 503 without --whisper-model.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { toFile } from 'openai';
import { binary, client, mainServer, sseEvents, startServer } from './lib/harness.mjs';

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'inferd-audio-e2e-'));
const whisperDir = path.join(work, 'whisper-test');
after(() => fs.rmSync(work, { recursive: true, force: true }));

/* A mono 16-bit WAV of a 440 Hz tone, seconds long, at rate. */
function wav(seconds = 1.5, rate = 22050) {
  const n = Math.round(seconds * rate), data = Buffer.alloc(n * 2);
  for (let i = 0; i < n; i++) data.writeInt16LE(Math.round(8000 * Math.sin((2 * Math.PI * 440 * i) / rate)), 2 * i);
  const h = Buffer.alloc(44);
  h.write('RIFF', 0); h.writeUInt32LE(36 + data.length, 4); h.write('WAVEfmt ', 8);
  h.writeUInt32LE(16, 16); h.writeUInt16LE(1, 20); h.writeUInt16LE(1, 22); h.writeUInt32LE(rate, 24);
  h.writeUInt32LE(rate * 2, 28); h.writeUInt16LE(2, 32); h.writeUInt16LE(16, 34);
  h.write('data', 36); h.writeUInt32LE(data.length, 40);
  return Buffer.concat([h, data]);
}

/* One sampled pass per window (temperature > 0 has no fallback ladder): quick on random weights. */
const base = { model: 'whisper-1', temperature: 0.3 };
let server;
before(async () => {
  execFileSync(binary, ['mkmodel', '--preset', 'whisper-test', '--out', whisperDir]);
  server = await startServer(['--whisper-model', whisperDir, '--max-audio-mb', '1']);
});
after(async () => { if (server) await server.stop(); });

const upload = async (buf = wav(), name = 'tone.wav') => toFile(buf, name, { type: 'audio/wav' });

describe('transcriptions through the openai SDK', () => {
  test('json is {text}', async () => {
    const r = await client(server.url).audio.transcriptions.create({ ...base, file: await upload() });
    assert.equal(typeof r.text, 'string');
  });

  test('text, srt and vtt come back as text of their shapes', async () => {
    const c = client(server.url);
    const text = await c.audio.transcriptions.create({ ...base, file: await upload(), response_format: 'text' });
    assert.equal(typeof text, 'string');
    const vtt = await c.audio.transcriptions.create({ ...base, file: await upload(), response_format: 'vtt' });
    assert.match(vtt, /^WEBVTT\n/);
    const srt = await c.audio.transcriptions.create({ ...base, file: await upload(), response_format: 'srt' });
    assert.equal(typeof srt, 'string');
    for (const m of srt.matchAll(/(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})/g)) assert.ok(m[1] <= m[2]);
  });

  test('verbose_json has language, duration and segments with times', async () => {
    const r = await client(server.url).audio.transcriptions.create({
      ...base, file: await upload(), response_format: 'verbose_json', language: 'en', timestamp_granularities: ['segment'],
    });
    assert.equal(r.language, 'en');
    assert.equal(r.task, 'transcribe');
    assert.ok(Math.abs(r.duration - 1.5) < 0.01, `duration ${r.duration}`);
    assert.ok(Array.isArray(r.segments));
    for (const s of r.segments) {
      assert.ok(s.start <= s.end);
      assert.equal(typeof s.text, 'string');
      assert.ok(Array.isArray(s.tokens));
    }
  });

  test('translations answer too', async () => {
    const r = await client(server.url).audio.translations.create({ ...base, file: await upload() });
    assert.equal(typeof r.text, 'string');
  });

  test('stream=true sends transcript.text.delta events and one transcript.text.done', async () => {
    const form = new FormData();
    form.append('file', new Blob([wav()], { type: 'audio/wav' }), 'tone.wav');
    form.append('model', 'whisper-1');
    form.append('temperature', '0.3');
    form.append('stream', 'true');
    const res = await fetch(`${server.url}/v1/audio/transcriptions`, { method: 'POST', body: form });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /text\/event-stream/);
    const events = sseEvents(await res.text()).map((e) => JSON.parse(e));
    const done = events.filter((e) => e.type === 'transcript.text.done');
    assert.equal(done.length, 1);
    assert.equal(events.at(-1).type, 'transcript.text.done');
    const deltas = events.filter((e) => e.type === 'transcript.text.delta').map((e) => e.delta).join('');
    assert.equal(deltas, done[0].text);
  });

  test('the Whisper model is listed and counted', async () => {
    const models = await client(server.url).models.list();
    assert.ok(models.data.some((m) => m.id === 'whisper-test'));
    const stats = await (await fetch(`${server.url}/stats`)).json();
    assert.ok(stats.transcription.requests >= 1);
    assert.ok(stats.transcription.audio_seconds > 0);
  });
});

const postForm = async (fields, route = 'transcriptions') => {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) {
    if (Array.isArray(v)) for (const x of v) form.append(k, x);
    else form.append(k, v);
  }
  if (!('file' in fields)) form.append('file', new Blob([wav()], { type: 'audio/wav' }), 'tone.wav');
  const res = await fetch(`${server.url}/v1/audio/${route}`, { method: 'POST', body: form });
  const text = await res.text();
  let body = text;
  try { body = JSON.parse(text); } catch { /* text formats */ }
  return { status: res.status, body, headers: res.headers };
};
const postJson = async (body, contentType = 'application/json', route = 'transcriptions') => {
  const res = await fetch(`${server.url}/v1/audio/${route}`, {
    method: 'POST', headers: { 'content-type': contentType }, body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json(), headers: res.headers };
};

/* The response extensions: the body's inferd object and the x-inferd-* headers. */
const assertTimings = (t, vad) => {
  for (const k of ['load_ms', 'transcribe_ms', 'total_ms']) assert.ok(typeof t[k] === 'number' && t[k] >= 0, `${k} ${t[k]}`);
  assert.ok(t.total_ms >= t.transcribe_ms, JSON.stringify(t));
  if (vad) assert.ok(typeof t.vad_ms === 'number' && t.vad_ms >= 0);
  else assert.equal(t.vad_ms, undefined);
};

describe('response extensions', () => {
  test('json and verbose_json carry inferd {model, language, duration, timings}, text formats the headers too', async () => {
    for (const response_format of ['json', 'verbose_json']) {
      const r = await postForm({ temperature: '0.3', language: 'en', response_format });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const x = r.body.inferd;
      assert.equal(x.model, 'whisper-test');
      assert.equal(x.language, 'en');
      assert.ok(Math.abs(x.duration - 1.5) < 0.01, `duration ${x.duration}`);
      assertTimings(x.timings, false);
      assert.equal(x.vocabulary, undefined);
      assert.equal(x.vad, undefined);
      assert.equal(r.headers.get('x-inferd-language'), 'en');
      assertTimings(JSON.parse(r.headers.get('x-inferd-timings')), false);
    }
    for (const response_format of ['srt']) { /* text, srt and vtt share one sender */
      const r = await postForm({ temperature: '0.3', language: 'en', response_format });
      assert.equal(r.status, 200);
      assert.equal(typeof r.body, 'string');
      assert.equal(r.headers.get('x-inferd-language'), 'en');
      assertTimings(JSON.parse(r.headers.get('x-inferd-timings')), false);
    }
  });

  test('vocabulary and vad appear when asked for, with vad_ms in the timings', async () => {
    const r = await postJson({ file: wav().toString('base64'), temperature: 0.3, vocabulary: ['inferd', 'Whisper'], vad: true });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const x = r.body.inferd;
    assert.equal(x.vocabulary.terms, 2);
    assert.ok(x.vocabulary.used >= 0 && x.vocabulary.used <= 2);
    assert.ok(Number.isInteger(x.vad.chunks) && x.vad.chunks >= 0);
    assert.ok(x.vad.speech_seconds >= 0 && x.vad.speech_seconds <= 1.5 + 1e-6);
    assertTimings(x.timings, true);
    assertTimings(JSON.parse(r.headers.get('x-inferd-timings')), true);
  });

  test('the streamed transcript.text.done carries the extension', async () => {
    const form = new FormData();
    form.append('file', new Blob([wav()], { type: 'audio/wav' }), 'tone.wav');
    form.append('temperature', '0.3');
    form.append('stream', 'true');
    const res = await fetch(`${server.url}/v1/audio/transcriptions`, { method: 'POST', body: form });
    const text = await res.text();
    const done = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)))
      .find((e) => e.type === 'transcript.text.done');
    assert.ok(done, text);
    assert.equal(done.inferd.model, 'whisper-test');
    assertTimings(done.inferd.timings, false);
  });
});

describe('streaming as decoded', () => {
  test('deltas carry their segment, progress per window, then one done', async () => {
    const form = new FormData();
    form.append('file', new Blob([wav(2)], { type: 'audio/wav' }), 'tone.wav');
    form.append('temperature', '0.3');
    form.append('response_format', 'verbose_json');
    form.append('stream', 'true');
    const res = await fetch(`${server.url}/v1/audio/transcriptions`, { method: 'POST', body: form });
    assert.equal(res.status, 200);
    const raw = await res.text();
    assert.match(raw, /^event: /m);
    const events = sseEvents(raw).map((e) => JSON.parse(e));
    const progress = events.filter((e) => e.type === 'transcript.progress');
    assert.ok(progress.length >= 1);
    assert.ok(Math.abs(progress.at(-1).done - 2) < 0.01 && Math.abs(progress.at(-1).total - 2) < 0.01);
    for (const d of events.filter((e) => e.type === 'transcript.text.delta')) {
      assert.equal(typeof d.segment.id, 'number');
      assert.ok(d.segment.start <= d.segment.end);
    }
    assert.equal(events.at(-1).type, 'transcript.text.done');
    assert.ok(Array.isArray(events.at(-1).segments));
  });

  test('a client that goes away cancels the decode and the server keeps serving', async () => {
    const form = new FormData();
    form.append('file', new Blob([wav(60, 8000)], { type: 'audio/wav' }), 'long.wav');
    form.append('stream', 'true');
    form.append('response_format', 'verbose_json');
    const stats = async () => (await (await fetch(`${server.url}/stats`)).json()).transcription;
    const before = await stats();
    const ac = new AbortController();
    const res = await fetch(`${server.url}/v1/audio/transcriptions`, { method: 'POST', body: form, signal: ac.signal });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read(); /* the first event is out: the decode is running */
    ac.abort();
    await reader.read().catch(() => {});
    const t0 = Date.now();
    const r = await postForm({ temperature: '0.3' });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(Date.now() - t0 < 60000);
    /* the long decode stopped as a failure: its 60 s of audio were never counted as transcribed */
    const after = await stats();
    assert.equal(after.failures, before.failures + 1);
    assert.ok(after.audio_seconds - before.audio_seconds < 30, `${after.audio_seconds} vs ${before.audio_seconds}`);
  });
});

describe('decoding options', () => {
  test('beam_size with temperature 0, no_speech_prob in segments, without_timestamps, condition_on_previous_text', async () => {
    const c = client(server.url);
    const r = await c.audio.transcriptions.create({
      model: 'whisper-1', file: await upload(), response_format: 'verbose_json', temperature: 0, beam_size: 3,
    });
    for (const s of r.segments) assert.ok(s.no_speech_prob >= 0 && s.no_speech_prob <= 1);
    const plain = await postForm({ temperature: '0.3', response_format: 'verbose_json', without_timestamps: 'true' });
    assert.equal(plain.status, 200);
    assert.ok(plain.body.segments.length <= 1, 'one window without timestamps is one segment');
    const cond = await postForm({ temperature: '0.3', condition_on_previous_text: 'false', no_speech_threshold: '0.5' });
    assert.equal(cond.status, 200, JSON.stringify(cond.body));
  });

  test('word timestamps: monotonic words inside their segments', async () => {
    const r = await client(server.url).audio.transcriptions.create({
      model: 'whisper-1', file: await upload(wav(3)), response_format: 'verbose_json', temperature: 0.3,
      timestamp_granularities: ['word', 'segment'],
    });
    assert.ok(Array.isArray(r.words));
    let last = 0;
    for (const w of r.words) {
      assert.equal(typeof w.word, 'string');
      assert.ok(w.start <= w.end && w.start >= last - 1e-9, JSON.stringify(w));
      last = w.end;
    }
    for (const s of r.segments) for (const w of s.words) assert.ok(w.start >= s.start - 1e-9 && w.end <= s.end + 1e-9);
  });

  test('vocabulary as an array or a comma string, VAD chunking', async () => {
    for (const vocabulary of [['inferd', 'Whisper'], 'inferd, Whisper']) {
      const r = await postJson({ file: wav().toString('base64'), temperature: 0.3, vocabulary });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    const v = await postForm({ temperature: '0.3', response_format: 'verbose_json', vad: 'true', vad_trim: 'true', vad_threshold: '0.4', vad_min_speech_ms: '100' });
    assert.equal(v.status, 200, JSON.stringify(v.body));
  });

  test('JSON bodies: base64, a data: URL, input_audio', async () => {
    const b64 = wav().toString('base64');
    for (const body of [{ file: b64 }, { file: `data:audio/wav;base64,${b64}` }, { input_audio: { data: b64 } }]) {
      const r = await postJson({ ...body, temperature: 0.3, response_format: 'json' });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(typeof r.body.text, 'string');
    }
  });

  test('bad options and bodies are 4xx with a reason', async () => {
    const cases = [
      [await postForm({ beam_size: '17' }), 400, /beam_size/],
      [await postForm({ beam_size: '0' }), 400, /beam_size/],
      [await postForm({ beam_size: '2.5' }), 400, /beam_size/],
      [await postForm({ beam_size: '3', temperature: '0.5' }), 400, /temperature 0/],
      [await postForm({ no_speech_threshold: '2' }), 400, /no_speech_threshold/],
      [await postForm({ timestamp_granularities: ['word'] }), 400, /verbose_json/],
      [await postForm({ timestamp_granularities: ['paragraph'] }), 400, /timestamp_granularities/],
      [await postForm({ condition_on_previous_text: 'maybe' }), 400, /condition_on_previous_text/],
      [await postForm({ vad_threshold: '1.5' }), 400, /vad_threshold/],
      [await postForm({ vocabulary: Array.from({ length: 8193 }, (_, i) => `w${i}`).join(',') }), 400, /vocabulary/],
      [await postForm({ file: new Blob([wav(0.05)]) }), 400, /0\.1 s/],
      [await postJson({ file: '!!not base64!!' }), 400, /base64/],
      [await postJson({ file: 42 }), 400, /file/],
      [await postJson({ temperature: 0.3 }), 400, /file/],
      [await postJson('{"file": "abc"', 'application/json'), 400, /JSON/],
      [await postJson({ file: wav().toString('base64'), vocabulary: [1, 2] }), 400, /vocabulary/],
      [await postJson('hello', 'text/plain'), 415, /Content-Type/],
    ];
    for (const [r, status, re] of cases) {
      assert.equal(r.status, status, JSON.stringify(r.body));
      assert.match(r.body.error.message, re);
    }
    assert.equal((await postForm({ temperature: '0.3' })).status, 200);
  });
});

describe('dictation sessions', () => {
  const api = (p, init) => fetch(`${server.url}/v1/audio/sessions${p}`, init);
  const pcm = (seconds) => {
    const n = Math.round(seconds * 16000), b = Buffer.alloc(n * 4);
    for (let i = 0; i < n; i++) b.writeFloatLE(0.3 * Math.sin((2 * Math.PI * 330 * i) / 16000), 4 * i);
    return b;
  };
  const create = async (params = {}) => api('', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(params) });

  test('create, send PCM and WAV chunks, finish with the whole transcript', async () => {
    const res = await create({ temperature: 0.3, response_format: 'verbose_json', vocabulary: 'alpha, beta' });
    assert.equal(res.status, 200);
    const s = await res.json();
    assert.match(s.id, /^ts_/);
    assert.equal(s.model, 'whisper-test');
    assert.deepEqual(s.vocabulary, ['alpha', 'beta']);
    let r = await (await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/pcm' }, body: pcm(1) })).json();
    assert.equal(r.id, s.id);
    assert.equal(r.samples, 16000);
    assert.ok(Math.abs(r.duration - 1) < 1e-6);
    assert.equal(typeof r.speech, 'boolean');
    assert.equal(r.segments, 0);
    r = await (await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/wav' }, body: wav(1) })).json();
    assert.equal(r.samples, 32000);
    const fin = await api(`/${s.id}/finish`, { method: 'POST' });
    assert.equal(fin.status, 200);
    const t = await fin.json();
    assert.equal(typeof t.text, 'string');
    assert.ok(Math.abs(t.duration - 2) < 0.01);
    assert.ok(Array.isArray(t.segments));
    const gone = await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/pcm' }, body: pcm(0.5) });
    assert.equal(gone.status, 404);
    assert.match((await gone.json()).error.message, /unknown transcription session/);
  });

  test('a completed 30 s window is transcribed when it arrives', async () => {
    const s = await (await create({ temperature: 0.3 })).json();
    let r;
    for (const seconds of [15, 15, 1]) /* chunks under the server's 1 MB --max-audio-mb */
      r = await (await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/pcm' }, body: pcm(seconds) })).json();
    assert.equal(r.samples, 31 * 16000);
    assert.ok(r.segments >= 0);
    assert.equal((await api(`/${s.id}`, { method: 'DELETE' })).status, 204);
  });

  test('delete, unknown ids, bad chunks, and the limit of 64 open sessions', async () => {
    const s = await (await create()).json();
    assert.equal((await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/pcm' }, body: Buffer.alloc(3) })).status, 400);
    assert.equal((await api(`/${s.id}/audio`, { method: 'POST', headers: { 'content-type': 'audio/wav' }, body: Buffer.from('not audio') })).status, 400);
    assert.equal((await api(`/${s.id}/rewind`, { method: 'POST' })).status, 404);
    assert.equal((await api(`/${s.id}`, { method: 'DELETE' })).status, 204);
    assert.equal((await api(`/${s.id}`, { method: 'DELETE' })).status, 404);
    assert.equal((await api('/ts_nope/finish', { method: 'POST' })).status, 404);
    assert.equal((await create({ response_format: 'srt' })).status, 400);
    assert.equal((await api('', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'x' })).status, 415);
    const ids = [];
    for (let i = 0; i < 64; i++) {
      const r = await create();
      assert.equal(r.status, 200);
      ids.push((await r.json()).id);
    }
    const over = await create();
    assert.equal(over.status, 429);
    assert.match((await over.json()).error.message, /too many open transcription sessions/);
    for (const id of ids) assert.equal((await api(`/${id}`, { method: 'DELETE' })).status, 204);
    assert.equal((await create()).status, 200);
  });
});

describe('bad uploads are 4xx with a reason', () => {
  const post = async (fields) => {
    const form = new FormData();
    for (const [k, v] of Object.entries(fields)) form.append(k, v);
    const res = await fetch(`${server.url}/v1/audio/transcriptions`, { method: 'POST', body: form });
    return { status: res.status, body: await res.json() };
  };
  const file = (bytes, name = 'x.wav') => new Blob([bytes], { type: 'application/octet-stream' });

  test('not audio, empty, truncated, no file, too large, bad format', async () => {
    const cases = [
      [{ file: file(Buffer.from('definitely not audio')) }, 400, /audio/],
      [{ file: file(Buffer.alloc(0)) }, 400, /empty/],
      [{ file: file(wav().subarray(0, 30)) }, 400, /WAV/],
      [{ model: 'whisper-1' }, 400, /file/],
      [{ file: file(Buffer.concat([wav(), Buffer.alloc(1 << 20)])) }, 413, /at most/],
      [{ file: file(wav()), response_format: 'mp4' }, 400, /response_format/],
      [{ file: file(wav()), language: 'klingon' }, 400, /language/],
      [{ file: file(wav()), temperature: 'hot' }, 400, /temperature/],
    ];
    for (const [fields, status, re] of cases) {
      const r = await post(fields);
      assert.equal(r.status, status, JSON.stringify(r.body));
      assert.match(r.body.error.message, re);
    }
  });

  test('a server without --whisper-model answers 503 naming the flag', async () => {
    const main = await mainServer();
    try {
      const form = new FormData();
      form.append('file', new Blob([wav()]), 'tone.wav');
      const res = await fetch(`${main.url}/v1/audio/transcriptions`, { method: 'POST', body: form });
      assert.equal(res.status, 503);
      assert.match((await res.json()).error.message, /--whisper-model/);
    } finally {
      if (main.own) await main.stop();
    }
  });
});
