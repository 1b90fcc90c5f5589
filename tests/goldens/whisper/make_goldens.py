#!/usr/bin/env python3
"""tests/goldens/whisper/make_goldens.py — transformers' reference outputs for the C Whisper parity tests.

Needs torch, transformers and numpy (the GPU machine has them). For each random-weight model
`inferd mkmodel --preset whisper-tiny|whisper-base --out DIR` writes, and each test clip, it saves
raw little-endian float32 files beside this script:

  sine_mel80.f32              WhisperFeatureExtractor(feature_size=80) of the 3 s clip
                              0.3 sin(2 pi 440 t) + 0.1 sin(2 pi 3000 t), its first
                              MEL_FRAMES frames (the clip and 100 frames of the padding,
                              which is one constant from there on): 80 x MEL_FRAMES
  sine_mel128.f32             the same with 128 bins
  PRESET_encoder.f32          the encoder's last hidden state for the whole 80-bin window,
                              every ENCODER_STRIDE-th position: (1500 / ENCODER_STRIDE) x d_model
  PRESET_logits.f32           decoder logits for the prompt below: n_prompt x vocab
  PRESET_prompt.i32           <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
  PRESET_generate.i32         the ids greedy generate() returns (transcribe, language en,
                              max_new_tokens=20): only the generated ones, never the prompt,
                              and not always 20: generate() runs its seek loop even without
                              return_timestamps, so when a window's ids hold a pair of
                              timestamp tokens (which <|notimestamps|> does not forbid) it
                              seeks to the pair's time and decodes the rest of the 3000 padded
                              frames as one more window (cut there, zero-padded), up to 20 ids
                              more each time; whisper-tiny's 40 ids are two such windows
  PRESET_translate.i32        the same for task translate, language de
  PRESET_lang.i32             detect_language(): the language token most likely after
                              <|startoftranscript|>

The subsets keep the committed files small (the checks stay the same: every stored value is
compared). The C tests (tests/unit/test_whisper.c) skip with a message while these files are absent.
Usage: make_goldens.py --inferd build/inferd [--out tests/goldens/whisper]
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
import torch
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration


MEL_FRAMES = 400
ENCODER_STRIDE = 10


def clip():
    t = np.arange(16000 * 3) / 16000.0
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)


def save(path, array, dtype):
    np.ascontiguousarray(array, dtype=dtype).tofile(path)
    print(f"wrote {path} {tuple(np.shape(array))}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inferd", default="build/inferd")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--presets", default="whisper-tiny,whisper-base")
    a = ap.parse_args()
    audio = clip()
    for bins in (80, 128):
        fe = WhisperFeatureExtractor(feature_size=bins)
        mel = fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
        save(os.path.join(a.out, f"sine_mel{bins}.f32"), mel[:, :MEL_FRAMES], np.float32)
    fe = WhisperFeatureExtractor(feature_size=80)
    feats = torch.from_numpy(fe(audio, sampling_rate=16000, return_tensors="np").input_features)
    for preset in a.presets.split(","):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([a.inferd, "mkmodel", "--preset", preset, "--out", d], check=True)
            model = WhisperForConditionalGeneration.from_pretrained(d, torch_dtype=torch.float32).eval()
            gc = model.generation_config
            prompt = [model.config.decoder_start_token_id, gc.lang_to_id["<|en|>"],
                      gc.task_to_id["transcribe"], gc.no_timestamps_token_id]
            with torch.no_grad():
                enc = model.model.encoder(feats).last_hidden_state[0]
                logits = model(input_features=feats, decoder_input_ids=torch.tensor([prompt])).logits[0]
                gen = model.generate(feats, language="en", task="transcribe", do_sample=False,
                                     max_new_tokens=20)[0]
                tr = model.generate(feats, language="de", task="translate", do_sample=False,
                                    max_new_tokens=20)[0]
                lang = model.detect_language(feats)[0]
            save(os.path.join(a.out, f"{preset}_encoder.f32"), enc.numpy()[::ENCODER_STRIDE], np.float32)
            save(os.path.join(a.out, f"{preset}_logits.f32"), logits.numpy(), np.float32)
            save(os.path.join(a.out, f"{preset}_prompt.i32"), np.array(prompt), np.int32)
            save(os.path.join(a.out, f"{preset}_generate.i32"), gen.numpy(), np.int32)
            save(os.path.join(a.out, f"{preset}_translate.i32"), tr.numpy(), np.int32)
            save(os.path.join(a.out, f"{preset}_lang.i32"), np.array([int(lang)]), np.int32)


if __name__ == "__main__":
    main()
