#!/usr/bin/env python3
"""tools/make_lora_goldens.py — reference logits of the tiny test models with a random PEFT LoRA adapter, from transformers + peft (or, without peft, torch forward hooks adding scale * B(A x) to each adapted Linear).

Usage (on a machine with torch and transformers; no network needed), from the repository root:

    python3 tools/make_lora_goldens.py --out tests/goldens/lora

It writes OUT/<preset>.json for every preset with a golden in tests/goldens (one
per architecture): the model as `inferd mkmodel --preset P --seed 1` writes it
(made by --inferd BIN, default build/inferd or build-cuda/inferd when one
exists; else, for the presets committed under tests/goldens/models, by
make_goldens.py's own writer), and the adapter as `inferd mkmodel --lora-for
DIR --rank 8 --alpha 16 --seed 1` writes it (every projection the
architecture has; Qwen3-MoE: attention only, since PEFT's module names would
also reach its experts), drawn here with mklora's formula
(src/tools/mklora.c) and its checksum recorded, which the C parity test
(tests/unit/test_lora.c) checks before comparing logits. The logit records
are make_goldens.py's (same cases, same fields). Presets it cannot make are
reported and skipped.
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

RANK, ALPHA, SEED = 8, 16.0, 1
MODULES = [  # mklora.c's table: (name, path, fused, mlp)
    ("q_proj", "self_attn.q_proj", False, False), ("k_proj", "self_attn.k_proj", False, False),
    ("v_proj", "self_attn.v_proj", False, False), ("o_proj", "self_attn.o_proj", False, False),
    ("qkv_proj", "self_attn.qkv_proj", True, False), ("gate_proj", "mlp.gate_proj", False, True),
    ("up_proj", "mlp.up_proj", False, True), ("down_proj", "mlp.down_proj", False, True),
    ("gate_up_proj", "mlp.gate_up_proj", True, True),
]


def shape_of(cfg, name, fused):
    phi3 = cfg["model_type"] == "phi3"
    if name not in ("o_proj", "down_proj") and fused != phi3:
        return None
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "qkv_proj": (q + 2 * kv, h), "gate_proj": (inter, h), "up_proj": (inter, h),
            "down_proj": (h, inter), "gate_up_proj": (2 * inter, h)}[name]


def layer_dense(cfg, i):
    if not cfg.get("num_experts"):
        return True
    step = cfg.get("decoder_sparse_step") or 1
    return i in (cfg.get("mlp_only_layers") or []) or (i + 1) % step != 0


def draw(seed, name, i):
    h = ((seed * mg.FNV_PRIME) & mg.MASK64) ^ mg.FNV_OFFSET
    for byte in name.encode():
        h = ((h ^ byte) * mg.FNV_PRIME) & mg.MASK64
    z = (h + i) & mg.MASK64  # base/hash.h's hash_mix64 (MurmurHash3's finalizer)
    z ^= z >> 33
    z = (z * 0xFF51AFD7ED558CCD) & mg.MASK64
    z ^= z >> 33
    z = (z * 0xC4CEB9FE1A85EC53) & mg.MASK64
    z ^= z >> 33
    return mg.f32((z >> 11) / 9007199254740992.0 * 2.0 - 1.0)


def write_adapter(model_dir, out_dir, targets):
    """mklora_write for model_dir: returns (the module names targeted, the file's FNV-1a)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    want = [m for m in MODULES if (targets is None or m[0] in targets) and shape_of(cfg, m[0], m[2])]
    tensors = []
    for layer in range(cfg["num_hidden_layers"]):
        for name, path, fused, mlp in want:
            if mlp and not layer_dense(cfg, layer):
                continue
            out, inp = shape_of(cfg, name, fused)
            for ab in (0, 1):
                tname = "base_model.model.model.layers.%d.%s.lora_%s.weight" % (layer, path, "AB"[ab])
                rows, cols = (out, RANK) if ab else (RANK, inp)
                hw = mg.f32(0.5 / mg.f32(math.sqrt(RANK))) if ab else mg.f32(1.0 / mg.f32(math.sqrt(inp)))
                tensors.append((tname, rows, cols, hw))
    tensors.sort(key=lambda t: t[0])
    parts, off = [], 0
    for tname, rows, cols, _ in tensors:
        parts.append(',"%s":{"dtype":"F32","shape":[%d,%d],"data_offsets":[%d,%d]}'
                     % (tname, rows, cols, off, off + 4 * rows * cols))
        off += 4 * rows * cols
    header = '{"__metadata__":{"format":"pt"}' + "".join(parts) + "}"
    header += " " * ((8 - len(header) % 8) % 8)
    body = bytearray(struct.pack("<Q", len(header)) + header.encode())
    for tname, rows, cols, hw in tensors:
        body += struct.pack("<%df" % (rows * cols),
                            *(mg.f32(hw * draw(SEED, tname, j)) for j in range(rows * cols)))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(body)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": model_dir,
              "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "use_rslora": False,
              "use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
              "target_modules": [m[0] for m in want]}
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return [m[0] for m in want], format(mg.fnv1a64_bytes(bytes(body)), "016x")


def with_adapter(model, adapter_dir, modules):
    """The model with the adapter applied: peft's LoRA layers, or forward hooks doing the same."""
    try:
        from peft import PeftModel
        import peft

        return PeftModel.from_pretrained(model, adapter_dir).eval(), "peft " + peft.__version__
    except ImportError:
        pass
    import torch
    from safetensors.torch import load_file

    weights = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    scale = ALPHA / RANK
    hooked = 0
    for name, mod in model.named_modules():
        key = "base_model.model." + name
        if key + ".lora_A.weight" not in weights:
            continue
        a, b = weights[key + ".lora_A.weight"], weights[key + ".lora_B.weight"]

        def hook(_m, inputs, output, a=a, b=b):
            x = inputs[0]
            return output + scale * torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)

        mod.register_forward_hook(hook)
        hooked += 1
    if 2 * hooked != len(weights):
        raise RuntimeError(f"{adapter_dir}: {len(weights)} tensors, {hooked} modules hooked")
    return model, "torch forward hooks (no peft)"


def golden_for(model_dir, adapter_dir, modules, adapter_fnv, seed):
    import torch
    import transformers

    name = os.path.basename(os.path.normpath(model_dir))
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vocab, split_at, top_k = cfg["vocab_size"], mg.longrope_split(cfg), min(mg.TOP_K, cfg["vocab_size"])
    model, how = with_adapter(mg.load_model(model_dir), adapter_dir, modules)
    cases = []
    with torch.no_grad():
        for index, length in enumerate(mg.CASE_LENGTHS):
            tokens = mg.case_tokens(vocab, seed, index, length)
            logits = mg.sequence_logits(model, torch.tensor([tokens], dtype=torch.long), split_at)
            cases.append({"tokens": tokens,
                          "positions": [mg.position_record(logits[i], top_k) for i in range(length)]})
    return {
        "model": name,
        "safetensors_fnv1a64": mg.fnv1a64_file(os.path.join(model_dir, "model.safetensors")),
        "config_fnv1a64": mg.fnv1a64_file(os.path.join(model_dir, "config.json")),
        "adapter": {"rank": RANK, "alpha": ALPHA, "seed": SEED, "targets": ",".join(modules),
                    "safetensors_fnv1a64": adapter_fnv, "reference": how},
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "token_seed": seed,
        "top_k": top_k,
        "cases": cases,
    }


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "goldens", "lora"))
    ap.add_argument("--inferd", help="an inferd binary to make the models with (default: "
                    "build/inferd or build-cuda/inferd when present)")
    ap.add_argument("--presets", nargs="+", help="default: every preset with a golden in tests/goldens")
    ap.add_argument("--seed", type=int, default=1, help="seed of the token cases (default 1)")
    args = ap.parse_args(argv)
    inferd = args.inferd or next((p for p in (os.path.join(root, "build", "inferd"),
                                              os.path.join(root, "build-cuda", "inferd"))
                                  if os.access(p, os.X_OK)), None)
    presets = args.presets or sorted(f[:-5] for f in os.listdir(os.path.join(root, "tests", "goldens"))
                                     if f.endswith(".json"))
    scratch = tempfile.mkdtemp(prefix="lora-goldens-")
    written, skipped = [], []
    for preset in presets:
        model_dir = os.path.join(scratch, preset)
        if inferd:
            subprocess.run([inferd, "mkmodel", "--preset", preset, "--seed", "1", "--out", model_dir],
                           check=True, stdout=subprocess.DEVNULL)
        elif os.path.isdir(os.path.join(root, "tests", "goldens", "models", preset)):
            mg.write_preset_model(preset, 1, model_dir)
        else:
            skipped.append(preset)
            continue
        with open(os.path.join(model_dir, "config.json")) as f:
            moe = bool(json.load(f).get("num_experts"))
        targets = {"q_proj", "k_proj", "v_proj", "o_proj"} if moe else None
        modules, fnv = write_adapter(model_dir, os.path.join(scratch, preset + "-adapter"), targets)
        golden = golden_for(model_dir, os.path.join(scratch, preset + "-adapter"), modules, fnv, args.seed)
        path = os.path.join(args.out, preset + ".json")
        mg.write_json(path, golden)
        written.append(preset)
        print(f"{path}: {golden['adapter']['reference']}, targets {golden['adapter']['targets']}",
              flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if skipped:
        print("skipped (no inferd binary to make them; pass --inferd): " + " ".join(skipped), flush=True)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
