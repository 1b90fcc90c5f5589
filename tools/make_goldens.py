#!/usr/bin/env python3
"""tools/make_goldens.py — reference logits from Hugging Face transformers for inferd's tiny test models.

Usage (on a machine with torch and transformers; no network needed):

    inferd mkmodel --preset tiny-qwen3 --seed 1 --out /tmp/m/tiny-qwen3   # one per tiny preset
    python3 tools/make_goldens.py --models /tmp/m/* --out tests/goldens

Each model directory DIR yields OUT/<basename of DIR>.json. The basename must
be the preset's name: the C parity test rebuilds the model from it and checks
the safetensors checksum recorded here before comparing logits.
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1

CASE_LENGTHS = (1, 6, 17, 40, 70)
TOP_K = 64


def fnv1a64_file(path):
    """FNV-1a 64 of a file, as 16 lowercase hex digits (same as mkmodel_file_fnv1a64)."""
    h = FNV_OFFSET
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            for byte in chunk:
                h = ((h ^ byte) * FNV_PRIME) & MASK64
    return format(h, "016x")


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compact(x):
    """A float with 9 significant digits (enough to round-trip a float32), written shortest."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"non-finite logit {x}")
    return float(f"{x:.9g}")


def case_tokens(vocab, seed, index, length):
    """Token ids for case index: Python's Mersenne Twister, the same on every platform."""
    rng = random.Random(seed * 1000 + index)
    return [rng.randrange(vocab) for _ in range(length)]


def load_model(model_dir):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    kwargs = {"attn_implementation": "eager", "output_loading_info": True}
    # transformers 4.56 renamed torch_dtype to dtype; 5.x defaults to the checkpoint's dtype.
    kwargs["dtype" if version >= (4, 56) else "torch_dtype"] = torch.float32
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise RuntimeError(f"{model_dir}: weights do not match the architecture: {problems}")
    for name, p in model.named_parameters():
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise RuntimeError(f"{model_dir}: {name} is {p.dtype} on {p.device}, want float32 on cpu")
    model.eval()
    return model


def position_record(row, top_k):
    import torch

    top = torch.topk(row, top_k, sorted=True)
    return {
        "argmax": int(torch.argmax(row)),
        "logsumexp": compact(torch.logsumexp(row, dim=0)),
        "max_abs": compact(row.abs().max()),
        "top_ids": [int(i) for i in top.indices],
        "top_logits": [compact(v) for v in top.values],
    }


def golden_for(model_dir, seed):
    import torch
    import transformers

    model_dir = os.path.normpath(model_dir)
    name = os.path.basename(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    top_k = min(TOP_K, vocab)
    model = load_model(model_dir)
    cases = []
    with torch.no_grad():
        for index, length in enumerate(CASE_LENGTHS):
            tokens = case_tokens(vocab, seed, index, length)
            ids = torch.tensor([tokens], dtype=torch.long)
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            if tuple(logits.shape) != (length, vocab):
                raise RuntimeError(f"{name}: logits shape {tuple(logits.shape)}")
            cases.append({
                "tokens": tokens,
                "positions": [position_record(logits[i], top_k) for i in range(length)],
            })
    return {
        "model": name,
        "config_sha": sha256_file(os.path.join(model_dir, "config.json")),
        "safetensors_fnv1a64": fnv1a64_file(os.path.join(model_dir, "model.safetensors")),
        "config_fnv1a64": fnv1a64_file(os.path.join(model_dir, "config.json")),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "token_seed": seed,
        "top_k": top_k,
        "cases": cases,
    }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True, help="model directories named after their presets")
    ap.add_argument("--out", required=True, help="directory for <model>.json")
    ap.add_argument("--seed", type=int, default=1, help="seed of the token cases (default 1)")
    args = ap.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    for model_dir in args.models:
        golden = golden_for(model_dir, args.seed)
        path = os.path.join(args.out, golden["model"] + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(golden, f, separators=(",", ":"), allow_nan=False)
            f.write("\n")
        os.replace(path + ".tmp", path)
        last = golden["cases"][-1]["positions"][-1]
        print(f"{path}: {sum(len(c['tokens']) for c in golden['cases'])} positions, "
              f"last argmax {last['argmax']} lse {last['logsumexp']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
