#!/usr/bin/env bash
# CPU benchmark of the engine core on this machine: builds, makes a
# Qwen3-0.6B-shaped bf16 model, and prints the matmul kernels' rates and the
# model's load, prefill and decode against the machine's own measured limits.
#   usage: bench/cpu.sh [MODEL_DIR]   (default: build/models/qwen3-0.6b)
set -euo pipefail
cd "$(dirname "$0")/.."
make build >/dev/null
model=${1:-build/models/qwen3-0.6b}
[ -f "$model/config.json" ] || build/inferd mkmodel --preset qwen3-0.6b --seed 1 --out "$model" >/dev/null
date -u +"%Y-%m-%d %H:%M UTC"
lscpu | grep -E 'Model name|^CPU\(s\)'
build/matmul_bench
build/inferd bench "$model" --prompt-len 128 --gen-len 32 --reps 5
build/inferd bench "$model" --prompt-len 128 --gen-len 32 --reps 5 --mode exact
