#!/usr/bin/env python3
"""bench/whisper_rtf.py — Whisper's real-time factor: inferd's /v1/audio/transcriptions against
transformers' generate() on the same clips, the same model directory, in the same run.

usage: whisper_rtf.py INFERD MODEL_DIR AUDIO_DIR [--device cuda|cpu] [--threads N] [--clips N]
                      [--reps R] [--no-transformers] [--fallback] [--chat-model DIR]

AUDIO_DIR holds WAV files (any rate; both sides resample to 16 kHz). Each clip is sent once as a
warm-up, then R times; a clip's time is the median of its repetitions, batch 1, greedy, English
transcription without timestamps. Prints, per side, the audio seconds, the processing seconds
and the real-time factor (audio seconds per processing second: higher is faster), then the
ratio, and where a clip has its text beside it (NAME.txt, as scripts/synth_speech.sh writes) each
side's word error rate (lowercase words without punctuation). inferd is timed from the client (HTTP and JSON included); transformers from the call to
generate() (feature extraction included) with fp16 weights on CUDA or f32 on the CPU, one greedy
pass (inferd's split says how many passes it made; --fallback gives generate() the ladder). The chat
model inferd serves beside Whisper is --chat-model (default: the repository's models/house).
"""
import argparse
import base64
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from wer import edit_distance, words  # noqa: E402 (scripts/wer.py)


def read_wav(path):
    """(rate, mono float32 samples) of a 16-bit PCM WAV file (numpy: the transformers side only)."""
    import numpy as np
    with wave.open(path, "rb") as w:
        rate, ch = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return rate, x.astype(np.float32).reshape(-1, ch).mean(axis=1) / 32768.0


def wav_seconds(path):
    with wave.open(path, "rb") as w:
        return w.getnframes() / w.getframerate()


class Server:
    def __init__(self, cmd, log):
        self.err = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        m = re.search(r"http://([^:]+):(\d+)", self.proc.stdout.readline())
        if not m:
            self.proc.kill()
            raise SystemExit(f"whisper_rtf: the server did not start: {open(log).read()[-2000:]}")
        self.url = f"http://{m.group(1)}:{m.group(2)}"

    def transcribe(self, wav_bytes):
        body = json.dumps({"file": base64.b64encode(wav_bytes).decode(), "language": "en",
                           "response_format": "json", "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/audio/transcriptions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["text"]

    def stats(self):
        with urllib.request.urlopen(self.url + "/stats", timeout=60) as r:
            return json.loads(r.read()).get("transcription") or {}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.err.close()


def wer(clips, texts):
    """Percent word error rate over the clips that have a reference text, or None."""
    errors = total = 0
    for path, hyp in zip(clips, texts):
        ref_path = os.path.splitext(path)[0] + ".txt"
        if os.path.exists(ref_path):
            r = words(open(ref_path).read())
            errors, total = errors + edit_distance(r, words(hyp)), total + len(r)
    return 100.0 * errors / total if total else None


def timed(fn, reps):
    fn()  # warm-up
    times = []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run_inferd(a, clips):
    with tempfile.TemporaryDirectory() as tmp:
        chat = a.chat_model
        cmd = [a.inferd, "serve", chat, "--port", "0", "--device", a.device,
               "--whisper-model", a.model, "--whisper-resident"]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        server = Server(cmd, os.path.join(tmp, "serve.log"))
        try:
            total, texts = 0.0, []
            for path in clips:
                data = open(path, "rb").read()
                t, text = timed(lambda: server.transcribe(data), a.reps)
                total += t
                texts.append(text)
            st = server.stats()
            n = max(1, int(st.get("requests", 0)))
            print(f"inferd's own split, per request over {n} (warm-ups included): "
                  f"compute {1e3 * st.get('compute_seconds', 0) / n:.1f} ms = mel "
                  f"{1e3 * st.get('mel_seconds', 0) / n:.1f} + encoder "
                  f"{1e3 * st.get('encode_seconds', 0) / n:.1f} + decoder "
                  f"{1e3 * st.get('decode_seconds', 0) / n:.1f} ms "
                  f"({st.get('decoder_steps', 0) / n:.1f} steps, "
                  f"{1e3 * st.get('decode_seconds', 0) / max(1, st.get('decoder_steps', 0)):.3f} ms "
                  f"each; {st.get('passes', 0) / n:.2f} passes per request) + the rest")
            return total, texts
        finally:
            server.stop()


def run_transformers(a, clips):
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    import torchaudio
    dev = "cuda" if a.device.startswith("cuda") else "cpu"
    if dev == "cpu" and a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.float16 if dev == "cuda" else torch.float32
    model = WhisperForConditionalGeneration.from_pretrained(a.model, torch_dtype=dtype).to(dev).eval()
    fe = WhisperFeatureExtractor.from_pretrained(a.model)
    gen = json.load(open(os.path.join(a.model, "generation_config.json")))
    prompt = [gen["decoder_start_token_id"], gen["lang_to_id"]["<|en|>"],
              gen["task_to_id"]["transcribe"], gen["no_timestamps_token_id"]]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    # inferd decodes a window as Whisper specifies: greedy, then again at 0.2, 0.4, ... 1.0
    # while the text compresses too well or its mean log-probability is below -1; --fallback
    # gives generate() that ladder (its compression ratio is taken over token bytes, hence its
    # own threshold), which it may walk where inferd does not
    ladder = (dict(temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), compression_ratio_threshold=1.35,
                   logprob_threshold=-1.0)
              if a.fallback else dict(do_sample=False))
    refused = []
    total, texts = 0.0, []
    for path in clips:
        rate, x = read_wav(path)

        def once():
            y = torch.from_numpy(x)
            if rate != 16000:
                y = torchaudio.functional.resample(y, rate, 16000)
            f = fe(y.numpy(), sampling_rate=16000, return_tensors="pt").input_features
            with torch.no_grad():
                try:
                    out = model.generate(f.to(dev, dtype), language="en", task="transcribe",
                                         max_new_tokens=220, num_beams=1, **ladder)
                except (ValueError, TypeError) as e:
                    if not refused:
                        print(f"generate() refused language/task or the ladder ({e}); "
                              "decoding greedily once from the prompt tokens", file=sys.stderr)
                        refused.append(e)
                    out = model.generate(f.to(dev, dtype), max_new_tokens=220, num_beams=1,
                                         do_sample=False,
                                         decoder_input_ids=torch.tensor([prompt], device=dev))
            if dev == "cuda":
                torch.cuda.synchronize()
            return out
        t, out = timed(once, a.reps)
        total += t
        texts.append(tok.decode([i for i in out[0].tolist() if i < gen["eos_token_id"]]))
    return total, texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inferd")
    ap.add_argument("model")
    ap.add_argument("audio_dir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--clips", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--fallback", action="store_true",
                    help="transformers walks Whisper's temperature ladder too (its thresholds "
                         "are its own, so it may walk it where inferd does not)")
    ap.add_argument("--chat-model", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "house"))
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(a.audio_dir, "*.wav")))[: a.clips]
    if not paths:
        raise SystemExit(f"whisper_rtf: no .wav files in {a.audio_dir}")
    clips = paths
    audio_s = sum(wav_seconds(p) for p in paths)
    print(f"{len(clips)} clips, {audio_s:.1f} s of audio, device {a.device}, "
          f"threads {a.threads or 'default'}, {a.reps} repetitions (median)")
    t_inferd, texts = run_inferd(a, clips)
    w = wer(clips, texts)
    print(f"inferd        {t_inferd:8.3f} s  RTF {audio_s / t_inferd:8.1f}x real time"
          + (f"  WER {w:.2f}%" if w is not None else ""))
    print(f"  first clip: {texts[0]!r}")
    if not a.no_transformers:
        t_tf, tf_texts = run_transformers(a, clips)
        w = wer(clips, tf_texts)
        print(f"transformers  {t_tf:8.3f} s  RTF {audio_s / t_tf:8.1f}x real time"
              + (f"  WER {w:.2f}%" if w is not None else ""))
        print(f"  first clip: {tf_texts[0]!r}")
        print(f"inferd / transformers speed: {t_tf / t_inferd:.2f}x")


if __name__ == "__main__":
    main()
