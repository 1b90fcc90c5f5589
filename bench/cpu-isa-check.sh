#!/usr/bin/env bash
# On a machine whose CPU has AVX-512 / AVX512-BF16 / AMX (the GPU host):
# runs the matmul and golden-parity tests at every ISA level, then times a
# Qwen3-0.6B-shaped model on 2 threads at each level and on all cores.
#   usage: bench/cpu-isa-check.sh BUNDLE   (BUNDLE from scripts/bundle-libs.sh,
#          with bin/inferd, bin/test_cpu_matmul, bin/test_golden_parity)
set -uo pipefail
bundle=$1
export LD_LIBRARY_PATH="$bundle/lib"
export INFERD_GOLDEN_DIR="$(cd "$(dirname "$0")/.." && pwd)/tests/goldens"
bin="$bundle/bin"
lscpu | grep -E 'Model name|^CPU\(s\)'
echo "== matmul tests at every level the CPU has"
"$bin/test_cpu_matmul" --jobs=1 2>&1 | tail -3
for level in avx2 avx512 avx512bf16 amx; do
  echo "== golden parity, INFERD_CPU=$level"
  INFERD_CPU=$level "$bin/test_golden_parity" --jobs=1 2>&1 | tail -1
done
model=$(mktemp -d)/qwen3-0.6b
"$bin/inferd" mkmodel --preset qwen3-0.6b --seed 1 --out "$model" >/dev/null
for level in avx2 avx512 avx512bf16 amx; do
  echo "== bench qwen3-0.6b, 2 threads, --cpu-isa $level"
  "$bin/inferd" bench "$model" --threads 2 --prompt-len 128 --gen-len 32 --reps 3 --cpu-isa $level
done
echo "== bench qwen3-0.6b, all cores, amx"
"$bin/inferd" bench "$model" --prompt-len 512 --gen-len 64 --reps 3
