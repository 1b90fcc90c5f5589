#!/usr/bin/env python3
"""scripts/train_whisper_house.py — trains models/whisper-house: a small English-only
Whisper-architecture model, from scratch, on synthetic speech (scripts/synth_speech.sh writes
NNNNNN.wav + NNNNNN.txt pairs), with PyTorch and transformers' Whisper on a GPU. Saves an HF
directory (config.json, generation_config.json, preprocessor_config.json, tokenizer files,
model.safetensors, training/results.json) that `inferd serve ... --whisper-model DIR` loads.

The tokenizer is the one `inferd mkmodel --preset whisper-test` writes (bytes, Whisper's special
tokens and its 1,501 timestamps), so nothing is downloaded. The prompt layout is the multilingual
one (<|en|><|transcribe|>), so the server decodes it with the same code as a real checkpoint.

How it trains, and why:
- Every clip is held on the GPU (16 kHz, one flat tensor), so a batch costs no host work.
- A 30 s window holds 1 to 6 clips placed one after another with pauses between them, as long
  speech is; the encoder costs the same for a window whatever it holds, so packing gives each
  step several times the speech of one clip a window.
- Half the windows are labelled with segment timestamps (<|t0|> text<|t1|> per clip, as Whisper's
  training data is), the other half with <|notimestamps|> and the plain text, so both of the
  server's decoding modes (json/text, and srt/vtt/verbose_json) are in distribution; a fifth of
  the windows carry a previous text (<|startofprev|> ...) as the server's long-audio decoding
  sends one.
- Gain and Gaussian noise vary per window; the log-mel features are computed on the GPU the way
  WhisperFeatureExtractor computes them.

usage: train_whisper_house.py --data SPEECH_DIR --heldout-data DIR --inferd build/inferd
       --out models/whisper-house [--deadline UNIX_TIME] [--minutes M] [--steps N] [--batch 96]
       [--d-model 192] [--layers 4] [--decoder-layers 3] [--lr 1.5e-3] [--save-dtype float16]
SPEECH_DIR is searched recursively for NNNNNN.wav + NNNNNN.txt pairs (16-bit PCM WAV, any rate).
Training stops after --steps or at the time limit, whichever comes first; a checkpoint is saved
every --checkpoint-seconds. Prints the held-out WER (greedy decoding without timestamps, text
lowercased to words without punctuation) and writes it with the run's settings to
OUT/training/results.json.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import tempfile
import time
import traceback
import wave
from multiprocessing.pool import ThreadPool

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from wer import edit_distance, words  # scripts/wer.py, beside this script

RATE = 16000
WINDOW = 30 * RATE          # samples in one encoder window
MAX_LABELS = 440            # decoder positions used of max_target_positions (448)
PREVIOUS_TEXT = 64          # tokens of previous text after <|startofprev|> (generation_config's
                            # max_previous_text_tokens tells the server)


def load_pairs(d):
    pairs = []
    for path in sorted(glob.glob(os.path.join(d, "**", "*.wav"), recursive=True)):
        txt = os.path.splitext(path)[0] + ".txt"
        if os.path.exists(txt):
            with open(txt) as f:
                text = f.read().strip()
            if text:
                pairs.append((path, text))
    return pairs


def read_wav(path):
    """(rate, mono int16 samples) of a 16-bit PCM WAV file, or None for a file cut short."""
    try:
        with wave.open(path, "rb") as w:
            rate, ch, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            raw = w.readframes(w.getnframes())
    except (EOFError, wave.Error, OSError):
        return None
    if width != 2:
        raise SystemExit(f"{path}: {8 * width}-bit samples, expected 16-bit PCM")
    x = np.frombuffer(raw[: len(raw) // (2 * ch) * 2 * ch], dtype="<i2")
    if ch > 1:
        x = x.reshape(-1, ch).mean(axis=1).astype(np.int16)
    return (rate, x) if len(x) >= rate // 10 else None


def resample(x, rate):
    """x (1-D, at rate) at 16 kHz, followed by the resampled padding: the ideal low-pass
    resampling, by FFT. The input is padded to a multiple of rate * 1024 samples so the transform
    sizes factor into small primes."""
    n_in = x.numel()
    unit = rate * 1024
    padded = (n_in + unit - 1) // unit * unit
    x = torch.nn.functional.pad(x, (0, padded - n_in))
    n_out = padded // rate * RATE
    spec = torch.fft.rfft(x)
    keep = min(spec.numel(), n_out // 2 + 1)
    return torch.fft.irfft(spec[:keep], n=n_out) * (n_out / padded)


class Clips:
    """Every clip of a speech directory at 16 kHz in one float16 tensor on the device."""

    def __init__(self, pairs, dev, tok, threads=16):
        t0 = time.time()
        with ThreadPool(threads) as pool:
            raw = pool.map(read_wav, [p for p, _ in pairs], chunksize=64)
        kept = [(text, c) for (_, text), c in zip(pairs, raw) if c is not None]
        self.texts = [t for t, _ in kept]
        self.ids = [tok.encode(" " + t, add_special_tokens=False).ids for t in self.texts]
        pieces, lengths = [], []
        # resample runs of clips of one rate together: one transform over thousands of clips
        run_rate, run = None, []

        def flush():
            if not run:
                return
            x = torch.from_numpy(np.concatenate(run)).to(dev).float() / 32768.0
            ends = np.round(np.cumsum([len(c) for c in run]) * (RATE / run_rate)).astype(np.int64)
            if run_rate != RATE:
                x = resample(x, run_rate)[: int(ends[-1])]
            starts = np.concatenate([[0], ends[:-1]])
            lengths.extend((ends - starts).tolist())
            pieces.append(x.half())
            run.clear()

        for _, (rate, x) in kept:
            if rate != run_rate or len(run) >= 2000:
                flush()
                run_rate = rate
            run.append(x)
        flush()
        self.audio = torch.cat(pieces) if pieces else torch.zeros(0, device=dev, dtype=torch.half)
        self.lengths = np.minimum(np.array(lengths, dtype=np.int64), WINDOW - RATE // 2)
        self.offsets = np.concatenate([[0], np.cumsum(np.array(lengths, dtype=np.int64))[:-1]])
        self.seconds = float(sum(lengths)) / RATE
        self.load_seconds = time.time() - t0

    def __len__(self):
        return len(self.texts)


class Mel:
    """Whisper's log-mel features on the device, as WhisperFeatureExtractor's torch path makes
    them: |STFT|^2 (400-point Hann window, hop 160, the last frame dropped), the Slaney mel
    filter bank, log10, floored at the window's maximum - 8, then (x + 4) / 4."""

    def __init__(self, n_mels, dev):
        filters = getattr(WhisperFeatureExtractor(feature_size=n_mels), "mel_filters", None)
        if filters is None:
            from transformers.audio_utils import mel_filter_bank
            filters = mel_filter_bank(num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0,
                                      max_frequency=8000.0, sampling_rate=RATE, norm="slaney",
                                      mel_scale="slaney")
        self.filters = torch.tensor(np.asarray(filters), dtype=torch.float32, device=dev)
        self.window = torch.hann_window(400, device=dev)

    def __call__(self, x):
        stft = torch.stft(x.float(), 400, 160, window=self.window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        mel = self.filters.T @ power
        log = torch.clamp(mel, min=1e-10).log10()
        log = torch.maximum(log, log.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (log + 4.0) / 4.0


class Vocab:
    def __init__(self, gen_cfg, tok):
        self.sot = gen_cfg["decoder_start_token_id"]
        self.eot = gen_cfg["eos_token_id"]
        self.en = gen_cfg["lang_to_id"]["<|en|>"]
        self.transcribe = gen_cfg["task_to_id"]["transcribe"]
        self.no_ts = gen_cfg["no_timestamps_token_id"]
        self.prev = gen_cfg["prev_sot_token_id"]
        self.ts0 = tok.token_to_id("<|0.00|>")
        if self.ts0 is None:
            raise SystemExit("the tokenizer has no <|0.00|> token")


def make_batch(clips, vocab, rng, batch, dev, p_timestamps=0.5, p_prev=0.2):
    """(waveforms [batch, WINDOW] on dev, decoder inputs, labels): each window 1-6 clips."""
    wav = torch.zeros(batch, WINDOW, device=dev, dtype=torch.half)
    seqs, n_prompt = [], []
    for b in range(batch):
        timestamps = rng.random() < p_timestamps
        prompt = [vocab.sot, vocab.en, vocab.transcribe] + ([] if timestamps else [vocab.no_ts])
        if rng.random() < p_prev:
            prompt = [vocab.prev] + clips.ids[int(rng.integers(len(clips)))][-PREVIOUS_TEXT:] + prompt
        labels_left = MAX_LABELS - len(prompt) - 1
        want = int(rng.integers(1, 7))
        t = float(rng.uniform(0.0, 1.0)) if timestamps else float(rng.uniform(0.0, 0.3))
        body = []
        for _ in range(want):
            i = int(rng.integers(len(clips)))
            n = int(clips.lengths[i])
            start = int(round(t * RATE))
            cost = len(clips.ids[i]) + (2 if timestamps else 0)
            if start + n > WINDOW or cost > labels_left:
                break
            o = int(clips.offsets[i])
            wav[b, start: start + n] = clips.audio[o: o + n]
            if timestamps:
                t0 = min(1500, int(round(start / RATE / 0.02)))
                t1 = min(1500, int(round((start + n) / RATE / 0.02)))
                body += [vocab.ts0 + t0] + clips.ids[i] + [vocab.ts0 + t1]
            else:
                body += clips.ids[i]
            labels_left -= cost
            t = (start + n) / RATE + float(rng.uniform(0.1, 1.2))
        seq = prompt + body + [vocab.eot]
        seqs.append(seq)
        n_prompt.append(len(prompt))
    # gain and noise per window (a quarter of the windows stay noise-free)
    gain = torch.tensor(10 ** (rng.uniform(-6, 6, batch) / 20), device=dev, dtype=torch.float32)
    sigma = torch.tensor(rng.uniform(0.0, 0.02, batch) * (rng.random(batch) > 0.25), device=dev,
                         dtype=torch.float32)
    x = wav.float() * gain[:, None] + torch.randn(batch, WINDOW, device=dev) * sigma[:, None]
    x = x.clamp_(-1, 1)
    width = max(len(s) for s in seqs) - 1
    dec_in = torch.full((batch, width), vocab.eot, dtype=torch.long)
    lab = torch.full((batch, width), -100, dtype=torch.long)
    for b, (s, p) in enumerate(zip(seqs, n_prompt)):
        dec_in[b, : len(s) - 1] = torch.tensor(s[:-1])
        lab[b, p - 1: len(s) - 1] = torch.tensor(s[p:])
    return x, dec_in.to(dev), lab.to(dev)


@torch.no_grad()
def heldout_wer(model, held, vocab, tok, mel, dev, show=6, max_new=MAX_LABELS):
    """Greedy decoding without timestamps of every held-out clip alone in its window."""
    model.eval()
    errors = n_words = 0
    prompt = [vocab.sot, vocab.en, vocab.transcribe, vocab.no_ts]
    for b0 in range(0, len(held), 64):
        idx = list(range(b0, min(len(held), b0 + 64)))
        wav = torch.zeros(len(idx), WINDOW, device=dev)
        for k, i in enumerate(idx):
            o, n = int(held.offsets[i]), int(held.lengths[i])
            wav[k, :n] = held.audio[o: o + n].float()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            enc = BaseModelOutput(last_hidden_state=model.get_encoder()(mel(wav)).last_hidden_state)
            ids = torch.tensor([prompt] * len(idx), device=dev)
            for _ in range(min(max_new, MAX_LABELS - len(prompt))):
                nxt = model(encoder_outputs=enc, decoder_input_ids=ids, use_cache=False).logits[:, -1].argmax(-1)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
                if bool((ids[:, len(prompt):] == vocab.eot).any(dim=1).all()):
                    break
        for k, i in enumerate(idx):
            body = ids[k, len(prompt):].tolist()
            body = body[: body.index(vocab.eot)] if vocab.eot in body else body
            hyp = tok.decode([t for t in body if t < vocab.eot])
            r, h = words(held.texts[i]), words(hyp)
            e = edit_distance(r, h)
            errors, n_words = errors + e, n_words + len(r)
            if e and show > 0:
                show -= 1
                print(f"  ref: {held.texts[i]}\n  hyp: {hyp}")
    model.train()
    return 100.0 * errors / max(n_words, 1), n_words


def save(model, out, save_dtype, gen_cfg, tok_files, info):
    os.makedirs(out, exist_ok=True)
    m = model
    if save_dtype == "float16":
        import copy
        m = copy.deepcopy(model).half()
    m.save_pretrained(out, safe_serialization=True)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["torch_dtype"] = save_dtype
    saved.pop("dtype", None)
    # the vocabulary is bytes, so every transcript begins with the space token itself (a real
    # checkpoint's first token is a word with its space): only <|endoftext|> is suppressed first
    saved["begin_suppress_tokens"] = [gen_cfg["eos_token_id"]]
    gen_cfg = {**gen_cfg, "begin_suppress_tokens": [gen_cfg["eos_token_id"]],
               "max_previous_text_tokens": PREVIOUS_TEXT}
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
    for name, text in tok_files.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(out, "training"), exist_ok=True)
    with open(os.path.join(out, "training", "results.json"), "w") as f:
        json.dump(info, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--heldout-data", required=True)
    ap.add_argument("--inferd", default="build/inferd")
    ap.add_argument("--out", default="models/whisper-house")
    ap.add_argument("--minutes", type=float, default=0)
    ap.add_argument("--deadline", type=float, default=0,
                    help="Unix time by which the model must be saved (training stops --margin s before)")
    ap.add_argument("--margin", type=float, default=45)
    ap.add_argument("--checkpoint-seconds", type=float, default=90)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--decoder-layers", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--save-dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wait-for", help="a file whose existence says --data is complete: the held-out "
                    "clips are loaded and one training step and one decoding run on them first, so a "
                    "fault shows before the training data is waited for")
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True

    with tempfile.TemporaryDirectory() as template:
        subprocess.run([a.inferd, "mkmodel", "--preset", "whisper-test", "--out", template], check=True,
                       stdout=subprocess.DEVNULL)
        tok = Tokenizer.from_file(os.path.join(template, "tokenizer.json"))
        with open(os.path.join(template, "generation_config.json")) as f:
            gen_cfg = json.load(f)
        with open(os.path.join(template, "config.json")) as f:
            base_cfg = json.load(f)
        tok_files = {}
        for n in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
            with open(os.path.join(template, n)) as f:
                tok_files[n] = f.read()
    vocab = Vocab(gen_cfg, tok)
    heads = max(1, a.d_model // 64)
    cfg = WhisperConfig(**{**base_cfg, "d_model": a.d_model, "encoder_layers": a.layers,
                           "decoder_layers": a.decoder_layers, "encoder_attention_heads": heads,
                           "decoder_attention_heads": heads, "encoder_ffn_dim": 4 * a.d_model,
                           "decoder_ffn_dim": 4 * a.d_model, "num_hidden_layers": a.layers,
                           "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0})
    model = WhisperForConditionalGeneration(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f} M parameters ({n_params * 2 / 2**20:.1f} MiB in 16 bits)", flush=True)
    mel = Mel(cfg.num_mel_bins, dev)

    held = Clips(load_pairs(a.heldout_data), dev, tok)
    if a.wait_for:
        x, dec_in, lab = make_batch(held, vocab, rng, 8, dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            model(input_features=mel(x), decoder_input_ids=dec_in, labels=lab).loss.backward()
        model.zero_grad(set_to_none=True)
        few = Clips(load_pairs(a.heldout_data)[:4], dev, tok)
        heldout_wer(model, few, vocab, tok, mel, dev, show=0, max_new=8)
        print(f"pipeline checked on the held-out clips ({time.time() - t_start:.0f} s); "
              f"waiting for {a.wait_for}", flush=True)
        while not os.path.exists(a.wait_for):
            time.sleep(1)
    train = Clips(load_pairs(a.data), dev, tok)
    print(f"{len(train)} training clips ({train.seconds / 3600:.1f} h, read in {train.load_seconds:.0f} s), "
          f"{len(held)} held out ({held.seconds / 60:.1f} min)", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    model.train()
    t_train = time.time()
    budget = a.minutes * 60 if a.minutes > 0 else float("inf")
    if a.deadline:
        budget = min(budget, a.deadline - a.margin - t_train)
    print(f"training for up to {budget:.0f} s", flush=True)
    info = {"parameters": n_params, "d_model": a.d_model, "encoder_layers": a.layers,
            "decoder_layers": a.decoder_layers, "batch_windows": a.batch, "lr": a.lr,
            "train_clips": len(train), "train_hours": round(train.seconds / 3600, 2),
            "heldout_clips": len(held)}
    step, last_ckpt, loss_avg = 0, time.time(), None
    try:
        while step < a.steps:
            # progress is steps or time, whichever runs out first: 3% warm-up, then cosine decay
            frac = max(step / a.steps, (time.time() - t_train) / budget)
            if frac >= 1:
                print(f"time limit reached at step {step}", flush=True)
                break
            lr = a.lr * (frac / 0.03 if frac < 0.03 else 0.5 * (1 + math.cos(math.pi * (frac - 0.03) / 0.97)))
            for g in opt.param_groups:
                g["lr"] = max(lr, a.lr * 0.02)
            x, dec_in, lab = make_batch(train, vocab, rng, a.batch, dev)
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                out = model(input_features=mel(x), decoder_input_ids=dec_in, labels=lab)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 100 == 0:
                loss = out.loss.item()
                loss_avg = loss if loss_avg is None else 0.9 * loss_avg + 0.1 * loss
                print(f"step {step} loss {loss:.4f} lr {lr:.2e} ({time.time() - t_start:.0f} s)", flush=True)
            if time.time() - last_ckpt > a.checkpoint_seconds:
                save(model, a.out + ".checkpoint", a.save_dtype, gen_cfg, tok_files, {**info, "steps": step})
                last_ckpt = time.time()
    except Exception:
        traceback.print_exc()
        print(f"training stopped by the error above at step {step}; saving what there is", flush=True)
    train_seconds = time.time() - t_train
    wer, n_words = heldout_wer(model, held, vocab, tok, mel, dev)
    print(f"held-out WER {wer:.2f}% over {len(held)} clips ({n_words} words), {step} steps "
          f"in {train_seconds:.0f} s", flush=True)
    info.update({"steps": step, "train_seconds": round(train_seconds), "final_loss": loss_avg,
                 "heldout_wer_percent": round(wer, 2), "heldout_words": n_words})
    save(model, a.out, a.save_dtype, gen_cfg, tok_files, info)
    print(f"saved {a.out} ({time.time() - t_start:.0f} s in all)", flush=True)


if __name__ == "__main__":
    main()
