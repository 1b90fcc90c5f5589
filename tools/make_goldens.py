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
the safetensors checksum recorded here before comparing logits.

Where inferd cannot be built (a machine with torch but without its C
dependencies), the presets whose configs are committed under
tests/goldens/models/ are written by this script itself, with mkmodel's
weight formula (src/tools/mkmodel.h), and checked against
tests/goldens/mkmodel_checksums.txt before any logit is computed:

    python3 tools/make_goldens.py --presets tiny-gemma3 tiny-phi3 --out tests/goldens

Phi-3's longrope: transformers picks the short or the long factors for a
whole forward by its last position; inferd picks per token by its own
position (so a token's K never depends on its step). The goldens run a
sequence longer than original_max_position_embeddings as two forwards split
there (the second over the first's cache), where the two rules agree.
"""

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile

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


# ---- mkmodel's weights, for the presets committed under tests/goldens/models ----

GAMMA = 0x9E3779B97F4A7C15


def f32(x):
    """x rounded to float32 (every float op below is one float32 op, as in mkmodel.c)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def fnv1a64_bytes(data):
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return h


def bf16_bits(x):
    """Round to nearest even, as base/bf16.h (no NaN can arise here)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


def preset_tensors(cfg):
    """(name, shape, kind) of every tensor mkmodel writes for a gemma3 or phi3 config."""
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    arch = cfg["model_type"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "embed")]
    layer = "model.layers.%d."
    if arch == "gemma3_text":
        out.append(("model.norm.weight", (h,), "norm_offset"))
        per = [("input_layernorm.weight", (h,), "norm_offset"),
               ("post_attention_layernorm.weight", (h,), "norm_offset"),
               ("pre_feedforward_layernorm.weight", (h,), "norm_offset"),
               ("post_feedforward_layernorm.weight", (h,), "norm_offset"),
               ("self_attn.q_proj.weight", (q, h), "linear"),
               ("self_attn.k_proj.weight", (kv, h), "linear"),
               ("self_attn.v_proj.weight", (kv, h), "linear"),
               ("self_attn.o_proj.weight", (h, q), "linear"),
               ("self_attn.q_norm.weight", (hd,), "norm_offset"),
               ("self_attn.k_norm.weight", (hd,), "norm_offset"),
               ("mlp.gate_proj.weight", (inter, h), "linear"),
               ("mlp.up_proj.weight", (inter, h), "linear"),
               ("mlp.down_proj.weight", (h, inter), "linear")]
    elif arch == "phi3":
        out.append(("model.norm.weight", (h,), "norm"))
        per = [("input_layernorm.weight", (h,), "norm"),
               ("post_attention_layernorm.weight", (h,), "norm"),
               ("self_attn.qkv_proj.weight", (q + 2 * kv, h), "linear"),
               ("self_attn.o_proj.weight", (h, q), "linear"),
               ("mlp.gate_up_proj.weight", (2 * inter, h), "linear"),
               ("mlp.down_proj.weight", (h, inter), "linear")]
    else:
        raise RuntimeError(f"no tensor list for model_type {arch}")
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h), "lm_head"))
    for i in range(cfg["num_hidden_layers"]):
        out += [(layer % i + n, shape, kind) for n, shape, kind in per]
    return sorted(out)


def half_width(kind, shape, cfg):
    sqrt3 = f32(math.sqrt(3.0))
    if kind == "embed":
        return f32(sqrt3 * f32(0.1)) if cfg["tie_word_embeddings"] else sqrt3
    if kind == "linear":
        return f32(sqrt3 * f32(1.0 / f32(math.sqrt(shape[1]))))
    if kind == "lm_head":
        return f32(sqrt3 * f32(2.0 / f32(math.sqrt(cfg["hidden_size"]))))
    return f32(0.1)  # norm, norm_offset


def write_preset_model(preset, seed, out_dir):
    """mkmodel --preset PRESET --seed SEED --out OUT_DIR for a preset committed under
    tests/goldens/models (its config files copied, its bf16 weights drawn here)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "tests", "goldens", "models", preset)
    os.makedirs(out_dir, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("torch_dtype") != "bfloat16":
        raise RuntimeError(f"{preset}: only bf16 presets are written here")
    tensors = preset_tensors(cfg)
    parts, offset = [], 0
    for name, shape, _ in tensors:
        n = 1
        for d in shape:
            n *= d
        parts.append('"%s":{"dtype":"BF16","shape":[%s],"data_offsets":[%d,%d]}'
                     % (name, ",".join(str(d) for d in shape), offset, offset + 2 * n))
        offset += 2 * n
    header = '{"__metadata__":{"format":"pt"},' + ",".join(parts) + "}"
    header += " " * ((8 - len(header) % 8) % 8)
    body = bytearray()
    seed_mix = mix64(seed & MASK64)
    for name, shape, kind in tensors:
        s0 = fnv1a64_bytes(name.encode()) ^ seed_mix
        a = half_width(kind, shape, cfg)
        n = 1
        for d in shape:
            n *= d
        for i in range(n):
            r = mix64((s0 + (i + 1) * GAMMA) & MASK64) >> 40
            u = (r - (1 << 23)) * 2.0 ** -23
            v = f32(a * u)
            if kind == "norm":
                v = f32(1.0 + v)
            body += struct.pack("<H", bf16_bits(v))
    data = struct.pack("<Q", len(header)) + header.encode() + bytes(body)
    want = None
    with open(os.path.join(root, "tests", "goldens", "mkmodel_checksums.txt")) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 2 and fields[0] == preset:
                want = fields[1]
    got = format(fnv1a64_bytes(data), "016x")
    if seed == 1 and got != want:
        raise RuntimeError(f"{preset}: model.safetensors FNV-1a {got}, mkmodel writes {want}")
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(data)
    return out_dir


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
def sequence_logits(model, ids, split_at):
    """Logits of every position of ids (1 x n): one forward without a cache, or with
    split_at, two forwards split there, the second over the first's cache."""
    import torch

    n = ids.shape[1]
    if not split_at or n <= split_at:
        return model(input_ids=ids, use_cache=False).logits[0].float()
    first = model(input_ids=ids[:, :split_at], use_cache=True)
    second = model(input_ids=ids[:, split_at:], past_key_values=first.past_key_values,
                   use_cache=True)
    return torch.cat([first.logits[0], second.logits[0]], dim=0).float()


def longrope_split(cfg):
    """Where Phi-3's longrope switches to the long factors, or None."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rs.get("rope_type", rs.get("type")) not in ("longrope", "su"):
        return None
    return rs.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")


def golden_for(model_dir, seed):
    import torch
    import transformers

    model_dir = os.path.normpath(model_dir)
    name = os.path.basename(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vocab = cfg["vocab_size"]
    split_at = longrope_split(cfg)
    top_k = min(TOP_K, vocab)
    model = load_model(model_dir)
    cases = []
    with torch.no_grad():
        for index, length in enumerate(CASE_LENGTHS):
            tokens = case_tokens(vocab, seed, index, length)
            ids = torch.tensor([tokens], dtype=torch.long)
            logits = sequence_logits(model, ids, split_at)
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
    ap.add_argument("--inferd", help="an inferd binary: make the --presets and --embed-presets models "
                    "with its mkmodel")
    ap.add_argument("--presets", nargs="+", default=[],
                    help="presets whose logit goldens to write: made by --inferd, or without it "
                    "written here from tests/goldens/models/<preset> and mkmodel's weight formula")
    ap.add_argument("--embed-presets", nargs="+", default=[],
                    help="presets whose embedding goldens to write to OUT/embeddings (needs --inferd)")
    ap.add_argument("--out", required=True, help="directory for <model>.json")
    ap.add_argument("--seed", type=int, default=1, help="seed of the token cases (default 1)")
    args = ap.parse_args(argv)

    if args.embed_presets and not args.inferd:
        ap.error("--embed-presets needs --inferd")
    if not (args.models or args.presets or args.embed_presets):
        ap.error("nothing to do: give --models, --presets or --embed-presets")
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="goldens-models-")
    models = list(args.models)
    if args.inferd:
        models += make_models(args.inferd, args.presets, scratch) if args.presets else []
    else:
        for preset in args.presets:
            models.append(write_preset_model(preset, 1, os.path.join(scratch, preset)))
            print(f"{preset}: model written with mkmodel's weights (checksum checked)", flush=True)
    for model_dir in (make_models(args.inferd, args.embed_presets, os.path.join(scratch, "embed"))
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
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
