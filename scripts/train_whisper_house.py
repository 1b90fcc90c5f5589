#!/usr/bin/env python3
"""scripts/train_whisper_house.py — trains models/whisper-house: a small (<= 40 MB) English-only
Whisper-architecture model, from scratch, on synthetic speech (scripts/synth_speech.sh writes
NNNNNN.wav + NNNNNN.txt pairs), with transformers and PyTorch on a GPU. Saves an HF directory
(config.json, generation_config.json, preprocessor_config.json, tokenizer files, model.safetensors)
that `inferd serve ... --whisper-model DIR` loads.

The tokenizer is the one `inferd mkmodel --preset whisper-test` writes (byte-level, Whisper's
special tokens), so no download is needed; the model is English-only in use (<|en|><|transcribe|>)
but keeps the multilingual prompt layout so the server's decoding is the same code path.

usage: train_whisper_house.py --data SPEECH_DIR --inferd build/inferd --out models/whisper-house
       [--heldout-data DIR | --heldout 200] [--steps 20000] [--minutes M] [--deadline T] [--batch 64]
       [--d-model 256] [--layers 4] [--decoder-layers N] [--lr 1e-3] [--save-dtype float16]
SPEECH_DIR is searched recursively for NNNNNN.wav + NNNNNN.txt pairs (16-bit PCM WAV, any rate).
Log-mel features are computed on the GPU; training stops after --steps or --minutes, whichever
comes first. Prints the held-out WER at the end (greedy decoding, text normalised to lowercase
words without punctuation) and writes it to OUT/training.json.
"""
import argparse
import glob
import json
import os
import random
import subprocess
import tempfile

import re
import time
import wave
from multiprocessing import get_context

import numpy as np
import torch
import torchaudio
from transformers import (WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                          PreTrainedTokenizerFast)


def load_pairs(d):
    pairs = []
    for wav in sorted(glob.glob(os.path.join(d, "**", "*.wav"), recursive=True)):
        txt = os.path.splitext(wav)[0] + ".txt"
        if os.path.exists(txt):
            pairs.append((wav, open(txt).read().strip()))
    return pairs


def read_wav(path):
    """(rate, mono float32 samples) of a 16-bit PCM WAV file, or None for a file cut short.
    numpy only: it runs in forked workers, where torch's thread pools can deadlock."""
    try:
        with wave.open(path, "rb") as w:
            rate, ch, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            raw = w.readframes(w.getnframes())
    except (EOFError, wave.Error):
        return None
    if width != 2:
        raise SystemExit(f"{path}: {8 * width}-bit samples, expected 16-bit PCM")
    x = np.frombuffer(raw[: len(raw) // (2 * ch) * 2 * ch], dtype="<i2")
    x = x.astype(np.float32).reshape(-1, ch).mean(axis=1) / 32768.0
    return (rate, x) if len(x) >= rate // 10 else None


def to_16k(clip, dev):
    """16 kHz samples of read_wav's (rate, samples), resampled on dev."""
    if clip is None:
        return None
    rate, x = clip
    if rate == 16000:
        return x
    y = torchaudio.functional.resample(torch.from_numpy(x).to(dev), rate, 16000)
    return y.cpu().numpy().astype(np.float32)


def augment(x, rng):
    gain = 10 ** (rng.uniform(-6, 6) / 20)
    noise = rng.normal(0, rng.uniform(0.0, 0.02), size=x.shape).astype(np.float32)
    return np.clip(x * gain + noise, -1, 1)


def words(text):
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(ref, hyp):
    r, h = words(ref), words(hyp)
    d = np.arange(len(h) + 1)
    for i in range(1, len(r) + 1):
        prev, d[0] = d.copy(), i
        for j in range(1, len(h) + 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
    return d[len(h)], len(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--inferd", default="build/inferd")
    ap.add_argument("--out", default="models/whisper-house")
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--heldout-data")
    ap.add_argument("--minutes", type=float, default=0)
    ap.add_argument("--deadline", type=float, default=0,
                    help="Unix time by which the model must be saved (training stops ~75 s before)")
    ap.add_argument("--decoder-layers", type=int, default=0)
    ap.add_argument("--save-dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    with tempfile.TemporaryDirectory() as template:
        subprocess.run([a.inferd, "mkmodel", "--preset", "whisper-test", "--out", template], check=True)
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(template, "tokenizer.json"))
        gen_cfg = json.load(open(os.path.join(template, "generation_config.json")))
        base_cfg = json.load(open(os.path.join(template, "config.json")))
        tok_files = {n: open(os.path.join(template, n)).read()
                     for n in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")}
    sot, eot = gen_cfg["decoder_start_token_id"], gen_cfg["eos_token_id"]
    prompt = [sot, gen_cfg["lang_to_id"]["<|en|>"], gen_cfg["task_to_id"]["transcribe"],
              gen_cfg["no_timestamps_token_id"]]
    cfg = WhisperConfig(**{**base_cfg, "d_model": a.d_model, "encoder_layers": a.layers,
                           "decoder_layers": a.decoder_layers or a.layers, "encoder_attention_heads": a.d_model // 64,
                           "decoder_attention_heads": a.d_model // 64,
                           "encoder_ffn_dim": 4 * a.d_model, "decoder_ffn_dim": 4 * a.d_model})
    model = WhisperForConditionalGeneration(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.1f} M parameters ({n_params * 4 / 2**20:.1f} MiB in f32)")
    fe = WhisperFeatureExtractor(feature_size=cfg.num_mel_bins)

    pairs = load_pairs(a.data)
    random.Random(a.seed).shuffle(pairs)
    if a.heldout_data:
        held, train = load_pairs(a.heldout_data), pairs
    else:
        held, train = pairs[: a.heldout], pairs[a.heldout:]
    t0 = time.time()
    with get_context("spawn").Pool(min(16, os.cpu_count() or 1)) as pool:
        train_audio = [to_16k(c, dev) for c in pool.map(read_wav, [p for p, _ in train], chunksize=64)]
        held_audio = [to_16k(c, dev) for c in pool.map(read_wav, [p for p, _ in held], chunksize=16)]
    # a file cut short by the synthesis' time limit is dropped
    train, train_audio = [p for p, x in zip(train, train_audio) if x is not None], \
        [x for x in train_audio if x is not None]
    held, held_audio = [p for p, x in zip(held, held_audio) if x is not None], \
        [x for x in held_audio if x is not None]
    seconds = sum(len(x) for x in train_audio) / 16000
    print(f"{len(train)} training clips ({seconds / 3600:.1f} h), {len(held)} held out, "
          f"read in {time.time() - t0:.0f} s", flush=True)

    def features(xs):
        try:
            f = fe(xs, sampling_rate=16000, return_tensors="pt", device=dev)
        except TypeError:
            f = fe(xs, sampling_rate=16000, return_tensors="pt")
        return f.input_features.to(dev)

    def labels_of(text):
        ids = prompt + tok(" " + text, add_special_tokens=False).input_ids[: 440 - len(prompt)] + [eot]
        return ids

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    model.train()
    t_train = time.time()
    budget = a.minutes * 60 if a.minutes > 0 else float("inf")
    if a.deadline:
        budget = min(budget, a.deadline - 75 - t_train)
    print(f"training for up to {budget:.0f} s", flush=True)
    step = 0
    for step in range(a.steps):
        # progress is steps or time, whichever runs out first: 5% warm-up, then cosine decay
        frac = max(step / a.steps, (time.time() - t_train) / budget)
        if frac >= 1:
            print(f"time limit reached at step {step}", flush=True)
            break
        lr = a.lr * (frac / 0.05 if frac < 0.05 else 0.5 * (1 + np.cos(np.pi * (frac - 0.05) / 0.95)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = rng.integers(0, len(train), a.batch)
        feats = features([augment(train_audio[i], rng) for i in idx])
        seqs = [labels_of(train[i][1]) for i in idx]
        width = max(len(s) for s in seqs)
        dec_in = torch.full((len(seqs), width - 1), eot, dtype=torch.long)
        lab = torch.full((len(seqs), width - 1), -100, dtype=torch.long)
        for i, s in enumerate(seqs):
            dec_in[i, : len(s) - 1] = torch.tensor(s[:-1])
            lab[i, len(prompt) - 1: len(s) - 1] = torch.tensor(s[len(prompt):])
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(input_features=feats, decoder_input_ids=dec_in.to(dev), labels=lab.to(dev))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0:
            print(f"step {step} loss {out.loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)

    model.eval()
    errors = n_words = 0
    with torch.no_grad():
        for b in range(0, len(held), 50):
            f = features(held_audio[b: b + 50])
            # plain greedy decoding (no generation config is needed for it)
            enc = model.model.encoder(f).last_hidden_state
            ids = torch.tensor([prompt] * f.shape[0], device=dev)
            for _ in range(220):
                nxt = model(encoder_outputs=(enc,), decoder_input_ids=ids).logits[:, -1].argmax(-1)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                if bool((ids[:, len(prompt):] == eot).any(dim=1).all()):
                    break
            out_ids = ids.tolist()
            for (_, text), ids in zip(held[b: b + 50], out_ids):
                body = ids[len(prompt):]
                hyp = tok.decode([i for i in (body[: body.index(eot)] if eot in body else body)
                                  if i < eot])
                e, n = wer(text, hyp)
                errors, n_words = errors + e, n_words + n
                if b == 0 and len(held_audio) and e and errors < 40:
                    print(f"  ref: {text}\n  hyp: {hyp}")
    held_wer = 100.0 * errors / max(n_words, 1)
    print(f"held-out WER {held_wer:.2f}% over {len(held)} clips ({n_words} words), "
          f"{step + 1} steps", flush=True)
    if a.save_dtype == "float16":
        model = model.half()

    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    cfg_path = os.path.join(a.out, "config.json")
    saved = json.load(open(cfg_path))
    saved["torch_dtype"] = a.save_dtype
    saved.pop("dtype", None)
    json.dump(saved, open(cfg_path, "w"), indent=2)
    json.dump(gen_cfg, open(os.path.join(a.out, "generation_config.json"), "w"), indent=2)
    for name, text in tok_files.items():
        open(os.path.join(a.out, name), "w").write(text)
    json.dump({"heldout_wer_percent": round(held_wer, 2), "heldout_clips": len(held),
               "heldout_words": n_words, "steps": step + 1, "train_clips": len(train),
               "train_hours": round(seconds / 3600, 2), "parameters": n_params,
               "d_model": a.d_model, "encoder_layers": a.layers,
               "decoder_layers": a.decoder_layers or a.layers, "batch": a.batch, "lr": a.lr},
              open(os.path.join(a.out, "training.json"), "w"), indent=2)
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
