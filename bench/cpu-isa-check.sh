#!/usr/bin/env bash
# On a machine whose CPU has AVX-512 / AVX512-BF16 / AMX (the GPU host):
# runs the matmul and golden-parity tests at every ISA level, then times a
# Qwen3-0.6B-shaped model on 2 threads at each level and on all cores.
# With bin/test_quant and bin/matmul_bench in the bundle it also checks the
# quantized kernels and prefill GEMM (AMX-INT8 tiles, real and emulated) and
# times Q8_0 / Q4_K_M files with the GEMM on VNNI and on AMX.
#   usage: bench/cpu-isa-check.sh BUNDLE   (BUNDLE from scripts/bundle-libs.sh,
#          with bin/inferd, bin/test_cpu_matmul, bin/test_golden_parity,
#          optionally bin/test_quant, bin/matmul_bench)
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
if [ -x "$bin/test_quant" ]; then
  echo "== quantized matmul and prefill GEMM (amx-int8: $(grep -qw amx_int8 /proc/cpuinfo && echo yes || echo no))"
  "$bin/test_quant" --jobs=1 --filter='quant_gemm/*' 2>&1 | tail -3
  "$bin/test_quant" --jobs=1 --filter='quant_matmul/*' 2>&1 | tail -1
fi
if [ -x "$bin/matmul_bench" ]; then
  for t in q8_0 q4_k; do
    for level in avx512bf16 amx; do
      echo "== matmul_bench 2 $level $t (GEMM: EXACT = decode kernels, FAST = the int8 GEMM)"
      "$bin/matmul_bench" 2 $level $t 2>&1 | sed -n '/^GEMM/,$p'
    done
  done
fi
model=$(mktemp -d)/qwen3-0.6b
for d in q8_0 q4_k_m; do
  "$bin/inferd" mkmodel --preset qwen3-0.6b --seed 1 --format gguf --dtype $d --out "$model-$d.gguf" >/dev/null
  for level in avx512bf16 amx; do
    echo "== bench qwen3-0.6b $d, 2 threads, --cpu-isa $level"
    "$bin/inferd" bench "$model-$d.gguf" --threads 2 --prompt-len 512 --gen-len 16 --reps 3 --cpu-isa $level
  done
done
"$bin/inferd" mkmodel --preset qwen3-0.6b --seed 1 --out "$model" >/dev/null
for level in avx2 avx512 avx512bf16 amx; do
  echo "== bench qwen3-0.6b, 2 threads, --cpu-isa $level"
  "$bin/inferd" bench "$model" --threads 2 --prompt-len 128 --gen-len 32 --reps 3 --cpu-isa $level
done
echo "== bench qwen3-0.6b, all cores, amx"
"$bin/inferd" bench "$model" --prompt-len 512 --gen-len 64 --reps 3
