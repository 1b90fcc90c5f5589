// tests/e2e/audio.test.mjs — /v1/audio/transcriptions and /translations through the official openai SDK against a server with a random-weight Whisper model (mkmodel --preset whisper-test): every response_format's shape, the streaming events, bad uploads as 4xx, and 503 without --whisper-model.
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
