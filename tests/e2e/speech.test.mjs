// tests/e2e/speech.test.mjs — the trained Whisper model (models/whisper-house) through the official openai SDK: the held-out synthetic speech in tests/audio/heldout (Ogg/Opus clips of sentences it never trained on, each with its text) transcribed with a word error rate under the measured ceiling, 55 s of speech (tests/audio/long) across two windows, and srt/verbose_json timestamps that fall on the speech.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { toFile } from 'openai';
import { client, startServer } from './lib/harness.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const whisperDir = path.join(root, 'models', 'whisper-house');
const clipsDir = path.join(root, 'tests', 'audio', 'heldout');

/* The ceiling from measurement: 11.5% over these 50 clips (834 words) on the CPU in fast mode
 * (11.9% in exact mode) and 9.1% over
 * the 400 clips they were taken from (WAV, transformers' decoding) when the model was trained;
 * the issue's target, 15%, leaves the CPU/GPU and rounding differences their room. */
const MAX_WER = 0.15;

const clips = fs.readdirSync(clipsDir).filter((f) => f.endsWith('.opus')).sort()
  .map((f) => ({ file: path.join(clipsDir, f), text: fs.readFileSync(path.join(clipsDir, f.replace(/\.opus$/, '.txt')), 'utf8').trim() }));

/* Lowercase words without punctuation, as the training script scores them. */
const words = (s) => s.toLowerCase().replace(/[^a-z0-9' ]/g, ' ').split(/\s+/).filter(Boolean);

function editDistance(r, h) {
  let d = Array.from({ length: h.length + 1 }, (_, j) => j);
  for (let i = 1; i <= r.length; i++) {
    const prev = d;
    d = [i];
    for (let j = 1; j <= h.length; j++) d[j] = Math.min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] !== h[j - 1] ? 1 : 0));
  }
  return d[h.length];
}

const upload = async (c) => toFile(fs.readFileSync(c.file), path.basename(c.file), { type: 'audio/ogg' });

let server;
before(async () => {
  server = await startServer(['--whisper-model', whisperDir, '--whisper-resident']);
});
after(async () => { if (server) await server.stop(); });

describe('models/whisper-house', () => {
  test('lists itself in /v1/models beside the chat model', async () => {
    const ids = (await client(server.url).models.list()).data.map((m) => m.id);
    assert.ok(ids.includes('whisper-house'), `ids: ${ids}`);
  });

  test(`transcribes the held-out speech with a word error rate under ${MAX_WER * 100}%`, { timeout: 600000 }, async () => {
    assert.ok(clips.length >= 40, `${clips.length} clips in ${clipsDir}`);
    const c = client(server.url);
    let errors = 0, total = 0;
    const worst = [];
    for (const clip of clips) {
      const hyp = await c.audio.transcriptions.create({ model: 'whisper-1', file: await upload(clip), language: 'en', temperature: 0, response_format: 'text' });
      const r = words(clip.text), e = editDistance(r, words(hyp));
      errors += e;
      total += r.length;
      worst.push({ e: e / r.length, ref: clip.text, hyp });
    }
    const wer = errors / total;
    worst.sort((a, b) => b.e - a.e);
    console.log(`word error rate ${(100 * wer).toFixed(2)}% (${errors} / ${total} words, ${clips.length} clips)`);
    assert.ok(wer <= MAX_WER, `WER ${(100 * wer).toFixed(2)}% > ${MAX_WER * 100}%; worst: ${JSON.stringify(worst.slice(0, 3), null, 1)}`);
  });

  test('55 s of speech in two windows: segments in order, seeking by their timestamps, the words within the long-audio ceiling', async () => {
    /* measured 22.3% (the short clips' 11.5% plus what the window boundary and the previous
     * text's conditioning cost); the ceiling leaves the platforms' rounding room */
    const file = path.join(root, 'tests', 'audio', 'long', 'ten-sentences.opus');
    const ref = fs.readFileSync(file.replace(/\.opus$/, '.txt'), 'utf8');
    const v = await client(server.url).audio.transcriptions.create({ model: 'whisper-1', file: await toFile(fs.readFileSync(file), 'ten-sentences.opus', { type: 'audio/ogg' }), response_format: 'verbose_json', timestamp_granularities: ['segment'] });
    assert.ok(v.duration > 30, `duration ${v.duration}`);
    assert.ok(v.segments.length >= 5, `${v.segments.length} segments`);
    for (let i = 1; i < v.segments.length; i++) assert.ok(v.segments[i].start >= v.segments[i - 1].end - 0.01, `segment ${i} starts at ${v.segments[i].start}, before ${v.segments[i - 1].end}`);
    assert.ok(v.segments.some((s) => s.start > 30), 'a segment in the second window');
    assert.ok(Math.abs(v.segments[v.segments.length - 1].end - v.duration) <= 1.5, `last segment ends at ${v.segments[v.segments.length - 1].end} of ${v.duration}`);
    const r = words(ref), wer = editDistance(r, words(v.text)) / r.length;
    console.log(`long audio: word error rate ${(100 * wer).toFixed(2)}% (${r.length} words, ${v.segments.length} segments)`);
    assert.ok(wer <= 0.3, `WER ${(100 * wer).toFixed(2)}%: ${v.text}`);
  });

  test('srt and verbose_json segments cover the speech and read as its words', async () => {
    const c = client(server.url);
    for (const clip of clips.slice(0, 3)) {
      const v = await c.audio.transcriptions.create({ model: 'whisper-1', file: await upload(clip), response_format: 'verbose_json', timestamp_granularities: ['segment'] });
      assert.ok(v.segments.length >= 1);
      const first = v.segments[0], last = v.segments[v.segments.length - 1];
      assert.ok(first.start <= 1.0, `first segment starts at ${first.start}`);
      // the clip is speech from start to end: the last segment ends within a second of its end
      assert.ok(Math.abs(last.end - v.duration) <= 1.0, `last segment ends at ${last.end}, the audio at ${v.duration}`);
      const r = words(clip.text);
      assert.ok(editDistance(r, words(v.text)) / r.length <= 0.5, `${v.text} against ${clip.text}`);
      const srt = await c.audio.transcriptions.create({ model: 'whisper-1', file: await upload(clip), response_format: 'srt' });
      assert.match(srt, /^1\n00:00:0\d,\d{3} --> 00:00:\d\d,\d{3}\n\S/);
    }
  });
});
