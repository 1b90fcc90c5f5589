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
       [--heldout 200] [--steps 20000] [--batch 64] [--d-model 256] [--layers 4] [--lr 1e-3]
Prints the held-out WER at the end (greedy decoding, text normalised to lowercase words).
"""
import argparse
import glob
import json
import os
import random
import subprocess
import tempfile

import numpy as np
import soundfile as sf
import torch
from transformers import (WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                          PreTrainedTokenizerFast)


def load_pairs(d):
    pairs = []
    for wav in sorted(glob.glob(os.path.join(d, "*.wav")) + glob.glob(os.path.join(d, "*.flac"))):
        txt = os.path.splitext(wav)[0] + ".txt"
        if os.path.exists(txt):
            pairs.append((wav, open(txt).read().strip()))
    return pairs


def resample(x, rate):
    if rate == 16000:
        return x
    n = int(round(len(x) * 16000 / rate))
    return np.interp(np.linspace(0, len(x) - 1, n), np.arange(len(x)), x).astype(np.float32)


def augment(x, rng):
    gain = 10 ** (rng.uniform(-6, 6) / 20)
    noise = rng.normal(0, rng.uniform(0.0, 0.02), size=x.shape).astype(np.float32)
    return np.clip(x * gain + noise, -1, 1)


def wer(ref, hyp):
    r, h = ref.lower().split(), hyp.lower().split()
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
                           "decoder_layers": a.layers, "encoder_attention_heads": a.d_model // 64,
                           "decoder_attention_heads": a.d_model // 64,
                           "encoder_ffn_dim": 4 * a.d_model, "decoder_ffn_dim": 4 * a.d_model})
    model = WhisperForConditionalGeneration(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.1f} M parameters ({n_params * 4 / 2**20:.1f} MiB in f32)")
    fe = WhisperFeatureExtractor(feature_size=cfg.num_mel_bins)

    pairs = load_pairs(a.data)
    random.Random(a.seed).shuffle(pairs)
    held, train = pairs[: a.heldout], pairs[a.heldout:]
    audio = {}

    def wav_of(path):
        if path not in audio:
            x, rate = sf.read(path, dtype="float32", always_2d=True)
            audio[path] = resample(x.mean(axis=1), rate)
        return audio[path]

    def labels_of(text):
        ids = prompt + tok(" " + text, add_special_tokens=False).input_ids[: 440 - len(prompt)] + [eot]
        return ids

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps, pct_start=0.05)
    model.train()
    for step in range(a.steps):
        batch = [train[i] for i in rng.integers(0, len(train), a.batch)]
        feats = fe([augment(wav_of(p), rng) for p, _ in batch], sampling_rate=16000,
                   return_tensors="pt").input_features.to(dev)
        seqs = [labels_of(t) for _, t in batch]
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
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0:
            print(f"step {step} loss {out.loss.item():.4f}", flush=True)

    model.eval()
    errors = words = 0
    with torch.no_grad():
        for p, text in held:
            f = fe(wav_of(p), sampling_rate=16000, return_tensors="pt").input_features.to(dev)
            ids = model.generate(f, decoder_input_ids=torch.tensor([prompt], device=dev),
                                 max_new_tokens=200, do_sample=False)[0].tolist()
            hyp = tok.decode([i for i in ids[len(prompt):] if i < eot])
            e, n = wer(text, hyp)
            errors, words = errors + e, words + n
    print(f"held-out WER {100.0 * errors / max(words, 1):.2f}% over {len(held)} clips")

    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    cfg_path = os.path.join(a.out, "config.json")
    saved = json.load(open(cfg_path))
    saved["torch_dtype"] = "float32"
    json.dump(saved, open(cfg_path, "w"), indent=2)
    json.dump(gen_cfg, open(os.path.join(a.out, "generation_config.json"), "w"), indent=2)
    for name, text in tok_files.items():
        open(os.path.join(a.out, name), "w").write(text)
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
