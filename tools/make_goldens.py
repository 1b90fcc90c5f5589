#!/usr/bin/env python3
"""tools/make_goldens.py — reference logits from Hugging Face transformers for inferd's tiny test models.

Usage (on a machine with torch and transformers; no network needed):

    inferd mkmodel --preset tiny-qwen3 --seed 1 --out /tmp/m/tiny-qwen3   # one per tiny preset
    python3 tools/make_goldens.py --models /tmp/m/* --out tests/goldens

or, letting the script make the models with an inferd binary:

    python3 tools/make_goldens.py --inferd build/inferd --presets tiny-qwen3_moe \
        --embed-presets tiny-qwen3 --out tests/goldens

Each model directory DIR yields OUT/<basename of DIR>.json. The basename must
be the preset's name: the C parity test rebuilds the model from it and checks
the safetensors checksum recorded here before comparing logits. A
mixture-of-experts model's file also holds "topk_probes": rows of router
logits with exact ties and the experts torch.topk picks from their softmax,
which the routing op must pick alike. --embed-presets writes
OUT/embeddings/<preset>.json: the last token's final hidden state
(last_hidden_state[:, -1], L2-normalised) per case, the embeddings endpoint's
reference.
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


def topk_probes(n_experts, top_k, seed):
    """Router logit rows with exact ties (at and around the top-k boundary) and torch.topk's picks."""
    import torch

    rng = random.Random(seed * 7919 + n_experts)
    probes = []
    for index in range(48):
        levels = [round(rng.uniform(-2.0, 2.0), 1) for _ in range(max(2, n_experts // 2))]
        row = [rng.choice(levels) for _ in range(n_experts)]
        if index % 3 == 0:
            row = [0.0] * n_experts
            row[rng.randrange(n_experts)] = 1.0
        logits = torch.tensor([row], dtype=torch.float32)
        p = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
        _, ids = torch.topk(p, top_k, dim=-1)
        probes.append({"logits": [compact(v) for v in row], "ids": [int(i) for i in ids[0]]})
    return {"top_k": top_k, "rows": probes}


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
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    extra = {}
    if config.get("num_experts"):
        extra["topk_probes"] = topk_probes(config["num_experts"], config["num_experts_per_tok"], seed)
    return {
        **extra,
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


def embedding_golden_for(model_dir, seed):
    """The last token's final-normed hidden state, L2-normalised, per case (Qwen3-Embedding's pooling)."""
    import torch
    import transformers

    model_dir = os.path.normpath(model_dir)
    name = os.path.basename(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    model = load_model(model_dir)
    cases = []
    with torch.no_grad():
        for index, length in enumerate(CASE_LENGTHS):
            tokens = case_tokens(vocab, seed, index, length)
            ids = torch.tensor([tokens], dtype=torch.long)
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[0, -1].float()
            emb = torch.nn.functional.normalize(hidden, p=2, dim=0)
            cases.append({"tokens": tokens, "embedding": [compact(v) for v in emb]})
    return {
        "model": name,
        "safetensors_fnv1a64": fnv1a64_file(os.path.join(model_dir, "model.safetensors")),
        "config_fnv1a64": fnv1a64_file(os.path.join(model_dir, "config.json")),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "pooling": "last_token",
        "normalize": True,
        "token_seed": seed,
        "cases": cases,
    }


def make_models(inferd, presets, root):
    """inferd mkmodel --preset P --seed 1 for each preset, under root; the directories."""
    import subprocess

    dirs = []
    for preset in presets:
        out = os.path.join(root, preset)
        subprocess.run([inferd, "mkmodel", "--preset", preset, "--seed", "1", "--out", out], check=True)
        dirs.append(out)
    return dirs


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=[], help="model directories named after their presets")
    ap.add_argument("--inferd", help="an inferd binary: make the --presets and --embed-presets models with it")
    ap.add_argument("--presets", nargs="+", default=[], help="presets whose logit goldens to write (needs --inferd)")
    ap.add_argument("--embed-presets", nargs="+", default=[],
                    help="presets whose embedding goldens to write to OUT/embeddings (needs --inferd)")
    ap.add_argument("--out", required=True, help="directory for <model>.json")
    ap.add_argument("--seed", type=int, default=1, help="seed of the token cases (default 1)")
    args = ap.parse_args(argv)

    if (args.presets or args.embed_presets) and not args.inferd:
        ap.error("--presets and --embed-presets need --inferd")
    if not (args.models or args.presets or args.embed_presets):
        ap.error("nothing to do: give --models, --presets or --embed-presets")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="goldens-models-")
    models = list(args.models) + (make_models(args.inferd, args.presets, tmp) if args.presets else [])
    os.makedirs(args.out, exist_ok=True)
    for model_dir in (make_models(args.inferd, args.embed_presets, os.path.join(tmp, "embed"))
                      if args.embed_presets else []):
        golden = embedding_golden_for(model_dir, args.seed)
        path = os.path.join(args.out, "embeddings", golden["model"] + ".json")
        write_json(path, golden)
        print(f"{path}: {len(golden['cases'])} embeddings", flush=True)
    for model_dir in models:
        golden = golden_for(model_dir, args.seed)
        path = os.path.join(args.out, golden["model"] + ".json")
        write_json(path, golden)
        last = golden["cases"][-1]["positions"][-1]
        print(f"{path}: {sum(len(c['tokens']) for c in golden['cases'])} positions, "
              f"last argmax {last['argmax']} lse {last['logsumexp']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
