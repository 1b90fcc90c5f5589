#!/usr/bin/env python3
"""bench/whisper_rtf.py — Whisper's real-time factor: inferd's /v1/audio/transcriptions against
transformers' generate() on the same clips, the same model directory, in the same run.

usage: whisper_rtf.py INFERD MODEL_DIR AUDIO_DIR [--device cuda|cpu] [--threads N] [--clips N]
                      [--reps R] [--no-transformers] [--chat-model DIR]

AUDIO_DIR holds WAV files (any rate; both sides resample to 16 kHz). Each clip is sent once as a
warm-up, then R times; a clip's time is the median of its repetitions, batch 1, greedy, English
transcription without timestamps. Prints, per side, the audio seconds, the processing seconds
and the real-time factor (audio seconds per processing second: higher is faster), then the
ratio. inferd is timed from the client (HTTP and JSON included); transformers from the call to
generate() (feature extraction included) with fp16 weights on CUDA or f32 on the CPU. The chat
model inferd serves beside Whisper is MODEL_DIR's sibling given by --chat-model (default: a tiny
model written by `inferd mkmodel --preset tiny-qwen3`).
"""
import argparse
import base64
import glob
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import wave

import numpy as np


def read_wav(path):
    with wave.open(path, "rb") as w:
        rate, ch = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return rate, x.astype(np.float32).reshape(-1, ch).mean(axis=1) / 32768.0


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

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.err.close()


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
        if not chat:
            chat = os.path.join(tmp, "chat")
            subprocess.run([a.inferd, "mkmodel", "--preset", "tiny-qwen3", "--out", chat],
                           check=True, stdout=subprocess.DEVNULL)
        cmd = [a.inferd, "serve", chat, "--port", "0", "--device", a.device,
               "--whisper-model", a.model, "--whisper-resident"]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        server = Server(cmd, os.path.join(tmp, "serve.log"))
        try:
            total, texts = 0.0, []
            for path, _, _ in clips:
                data = open(path, "rb").read()
                t, text = timed(lambda: server.transcribe(data), a.reps)
                total += t
                texts.append(text)
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
    total = 0.0
    for _, rate, x in clips:
        def once():
            y = torch.from_numpy(x)
            if rate != 16000:
                y = torchaudio.functional.resample(y, rate, 16000)
            f = fe(y.numpy(), sampling_rate=16000, return_tensors="pt").input_features
            with torch.no_grad():
                try:
                    out = model.generate(f.to(dev, dtype), language="en", task="transcribe",
                                         max_new_tokens=220, num_beams=1, do_sample=False)
                except (ValueError, TypeError):
                    out = model.generate(f.to(dev, dtype), max_new_tokens=220, num_beams=1,
                                         do_sample=False,
                                         decoder_input_ids=torch.tensor([prompt], device=dev))
            if dev == "cuda":
                torch.cuda.synchronize()
            return out
        t, _ = timed(once, a.reps)
        total += t
    return total


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
    ap.add_argument("--chat-model")
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(a.audio_dir, "*.wav")))[: a.clips]
    if not paths:
        raise SystemExit(f"whisper_rtf: no .wav files in {a.audio_dir}")
    clips = [(p, *read_wav(p)) for p in paths]
    audio_s = sum(len(x) / rate for _, rate, x in clips)
    print(f"{len(clips)} clips, {audio_s:.1f} s of audio, device {a.device}, "
          f"threads {a.threads or 'default'}, {a.reps} repetitions (median)")
    t_inferd, texts = run_inferd(a, clips)
    print(f"inferd        {t_inferd:8.3f} s  RTF {audio_s / t_inferd:8.1f}x real time")
    print(f"  first clip: {texts[0]!r}")
    if not a.no_transformers:
        t_tf = run_transformers(a, clips)
        print(f"transformers  {t_tf:8.3f} s  RTF {audio_s / t_tf:8.1f}x real time")
        print(f"inferd / transformers speed: {t_tf / t_inferd:.2f}x")


if __name__ == "__main__":
    main()
