#!/usr/bin/env bash
# bench/gpu.sh — the CUDA backend on a GPU machine in one run: parity tests, real-shape models, the speed table.
#
#   usage: bench/gpu.sh [parity] [bench] [8k] [profile] [serve] [agent] [spec] [quant] [moe] [tp] [lora] [MODEL...]
#     tp       tensor parallelism's NCCL path (tests/unit/test_tensor_parallel.c: one
#              rank through NCCL against the plain model; two ranks where there are two
#              GPUs); NCCL from $INFERD_NCCL_LIB, else PyTorch's nvidia-nccl wheel
#     parity   the CUDA parity tests (goldens, CPU-vs-CUDA greedy tokens, graphs)
#     bench    prefill pp512 / decode tg128 per model (and pp4096 for llama-3.1-8b),
#              prefill again with f32 attention, the 8B's load time
#     8k       decode after an 8k-token prompt
#     profile  GPU time per kind of kernel (--cuda-profile ops), with and
#              without the RMSNorm folded into the GEMVs
#     serve    `inferd serve --device cuda`: the house model answers a chat and
#              serves 1-64 concurrent streams (bench/serve_concurrency.py); the
#              server tax (bench/serve_tax.py) and start-to-ready per model
#     cache    prefix-cache hits against cold runs through `inferd serve --device
#              cuda` (bench/cache_check.py): identical in exact mode on every
#              tiny architecture and the real shapes; agreement in fast mode
#     agent    the prefix cache: the agent workload (bench/agent_workload.py,
#              16 sessions x 8 turns on a 2,000-token system prompt, cache on
#              against --prompt-cache 0) and 1/8/16/32/64 concurrent streams of
#              512-token prompts and 128 tokens (bench/serve_concurrency.py);
#              on llama-3.1-8b unless models are named (AGENT_CONCURRENCY: the
#              sessions at a time, default "4 16"; AGENT_SERVER_ARG: more serve flags)
#     rows     decode through `inferd serve --device cuda` at 1-16 streams with
#              --cuda-gemv-rows 8, 4, 2 and 1 (which row counts the GEMV kernels
#              or cuBLASLt serve faster); on llama-3.1-8b unless models are named
#     ssd      the SSD tier: time to first token of a 16k-token prefix after a restart
#              (bench/ssd_restart.py restart, page cache dropped and warm) with the
#              cost model's choice, then with --ssd-restore always and never, against a
#              cold prefill; decode beside write-behind against the tier off; on
#              llama-3.1-8b unless models are named (SSD_PROMPT_LEN: the prefix, default 16000;
#              SSD_RESTORE_MODES: default "auto always never"; SSD_DECODE=0 skips decode)
#     structured  a JSON-schema reply against the same prompt unconstrained, batch 1
#              (bench/structured_bench.py): decode tok/s, jump-forward's share, mask time;
#              on llama-3.1-8b unless models are named
#     spec     speculative decoding: the house pair greedy at batch 1 and prompt lookup on
#              the copy workload against plain decoding (bench/spec_bench.sh --device cuda);
#              the verify step's cost on the llama-3.1-8b shape (one target step over 1 + 4
#              tokens against one decode step, inferd bench --verify-cost 4); 16 concurrent
#              streams with speculation on and off (bench/serve_concurrency.py): the house
#              pair, and the 8B shape with prompt lookup on its random weights (acceptance
#              near zero: adaptive K must back off, within 5% of off)
#     kvquant  KV-cache quantization (--kv-quant) against the fp16 cache, per format
#              (KVQ_FORMATS, default "off 8 turbo turbo:k4v3 4"): aggregate decode of 32
#              streams after 8k-token prompts through `inferd serve --device cuda`
#              (bench/serve_concurrency.py; KVQ_GEN_LEN tokens each, default 1,024, so that
#              all 32 decode together once the staggered prefills are done), the cache bytes per token and the 8k
#              sequences a 32 GB KV budget holds, batch-1 decode after a 32k-token
#              prompt and prefill of 4k tokens (the quantize-on-write cost; inferd
#              bench); on llama-3.1-8b unless models are named
#     quant    block-quantized weights: the quantized kernels' test
#              (tests/unit/test_cuda_quant.c: each type's GEMV and GEMM against the
#              CPU reference, tiny GGUF and MLX models against the CPU, graphs), then
#              GGUF files written by mkmodel (QUANT_FILES, default "llama-3.1-8b:q8_0
#              llama-3.1-8b:q4_k_m llama-3.2-1b:q4_k_m") through inferd bench: decode
#              of 128 tokens and prefill of 512, the weight bytes each token reads
#              and the bandwidth floor beside each; decode again with --cuda-qgemv
#              dp4a (x quantized by a launch of its own instead of the stream
#              kernel; QUANT_DP4A=0 skips it) and float (x in f32 instead of int8
#              blocks; QUANT_FLOAT=0 skips it, QUANT_PREFILL=0 the prefill lines)
#     moe      mixture of experts: the MoE kernels' test (tests/unit/test_cuda_moe.c: the
#              GEMVs and the grouped GEMM against the CPU, rows alone against batches,
#              graphs, timings per row count), then the qwen3-30b-a3b shape (61 GB of
#              bf16, written once to /dev/shm when it has room, else to $INFERD_MODELS,
#              and deleted at the end) through inferd bench: decode tg128 after a
#              512-token prompt and prefill pp4096 in one chunk, each again with
#              --cuda-moe off (the first kernels), and gemma-3-4b decode tg128; the
#              floor is on each decode line (MOE_TEST=0 skips the test, MOE_BENCH=0
#              the models)
#     lora     LoRA adapters: the CUDA op against the CPU's (test_lora --filter 'lora_cuda/*'),
#              then decode tok/s of 16 sequences over 0, 1, 4 and 16 distinct random rank-16
#              adapters on every projection (inferd bench --adapters 0,1,4,16 --rank 16
#              --batch 16 --device cuda; the adapters are mkmodel --lora-for's); on
#              llama-3.2-1b and llama-3.1-8b unless models are named
#     MODEL    mkmodel presets (default: qwen3-0.6b llama-3.2-1b llama-3.1-8b)
#   With no stage named, parity, bench and 8k run.
#
# Binaries come from .bundle/bin (scripts/bundle-libs.sh .bundle build/inferd
# build/test_cuda_parity build/test_cuda_sampling build/test_cuda_kv_quant build/test_cuda_quant
# build/test_cuda_moe,
# libraries in .bundle/lib, or the same packed as
# .bundle/bundle.tar.xz) when present, else from
# build/ (configure with nvcc on the PATH). cuBLASLt is taken from the
# machine's CUDA toolkit. Models are written to $INFERD_MODELS (default
# /tmp/inferd-models) once and reused.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

stages=() models=()
for a in "$@"; do
  case "$a" in
    parity|bench|8k|profile|serve|cache|agent|rows|ssd|structured|spec|kvquant|quant|moe|tp|lora) stages+=("$a") ;;
    *) models+=("$a") ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || stages=(parity bench 8k)
agent_models=("${models[@]}")
[ ${#agent_models[@]} -gt 0 ] || agent_models=(llama-3.1-8b)
lora_models=("${models[@]}")
[ ${#lora_models[@]} -gt 0 ] || lora_models=(llama-3.2-1b llama-3.1-8b)
[ ${#models[@]} -gt 0 ] || models=(qwen3-0.6b llama-3.2-1b llama-3.1-8b)
has_stage() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# A bundle may travel compressed: tar -C BUNDLE -cJf .bundle/bundle.tar.xz bin lib
if [ -f .bundle/bundle.tar.xz ] && [ ! -x .bundle/bin/inferd ]; then
  tar -C .bundle -xJf .bundle/bundle.tar.xz
fi
if [ -x .bundle/bin/inferd ]; then
  bin=.bundle/bin
  libdirs=$root/.bundle/lib
else
  bin=build
  libdirs=
fi
lt=$(find /usr/local/cuda*/ /usr/lib /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
       -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
[ -n "$lt" ] && libdirs=$libdirs:$(dirname "$lt")
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export INFERD_GOLDEN_DIR=$root/tests/goldens
# real tokenizers (scripts/fetch-tokenizers.sh, or carried along) for the
# tests that run the engine and for serve
[ -z "${INFERD_TOKENIZER_DATA:-}" ] && [ -d "$root/build/text-data" ] &&
  export INFERD_TOKENIZER_DATA=$root/build/text-data
models_dir=${INFERD_MODELS:-/tmp/inferd-models}
mkdir -p "$models_dir"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader || true
echo "binaries: $bin; cuBLASLt: ${lt:-not found}"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

if has_stage parity; then
  echo "== parity (tests/unit/test_cuda_parity.c)"
  start=$(date +%s.%N)
  timeout 300 "$bin"/test_cuda_parity --verbose=1 --jobs=1 2>&1 | grep -E "cuda |PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error" 
  echo "-- sampling on the GPU against the host sampler (tests/unit/test_cuda_sampling.c)"
  timeout 300 "$bin"/test_cuda_sampling --verbose=1 --jobs=1 2>&1 | grep -E "cuda |PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
  if [ -x "$bin"/test_cuda_kv_quant ]; then
    echo "-- quantized KV caches against the CPU backend's (tests/unit/test_cuda_kv_quant.c)"
    timeout 900 "$bin"/test_cuda_kv_quant --verbose=1 --jobs=1 2>&1 | grep -E "PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
  fi
  echo "parity: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $start }") s"
fi

make_model() {
  local preset=$1 dir=$models_dir/$1
  if [ ! -f "$dir/config.json" ] || [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    local t0=$(date +%s.%N)
    "$bin"/inferd mkmodel --preset "$preset" --seed 1 --out "$dir" >/dev/null || return 1
    touch "$dir/.complete"
    echo "mkmodel $preset: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s, $(du -sh "$dir" | cut -f1)" >&2
  fi
  echo "$dir"
}

# add_tokenizer PRESET DIR: serve needs a tokenizer that covers the model's
# vocabulary: the real one of the family when $INFERD_TOKENIZER_DATA has it
# (scripts/fetch-tokenizers.sh), else the house one (ids past its 8,192 then
# decode to no text).
add_tokenizer() {
  local family tdir
  case "$1" in qwen*) family=qwen3 ;; llama*) family=llama3 ;; *) family= ;; esac
  tdir=${INFERD_TOKENIZER_DATA:-build/text-data}/$family
  [ -n "$family" ] && [ -f "$tdir/tokenizer.json" ] || tdir=models/house
  cp "$tdir"/tokenizer.json "$tdir"/tokenizer_config.json "$2"/
}

summary=()
# bench_one LABEL DIR ARGS...: runs inferd bench and keeps its prefill/decode lines
# (backend flags among ARGS, and INFERD_CUDA_* settings in the caller's environment, apply).
bench_one() {
  local label=$1 dir=$2
  shift 2
  echo "-- $label: inferd bench $dir --device cuda $*"
  local out
  out=$(timeout 300 "$bin"/inferd bench "$dir" --device cuda "$@" 2>&1)
  echo "$out"
  local pre dec floor
  pre=$(echo "$out" | sed -n 's/^prefill .*: \([0-9.]*\) tok\/s.*/\1/p')
  dec=$(echo "$out" | sed -n 's/^decode  .*tokens: \([0-9.]*\) tok\/s.*/\1/p')
  floor=$(echo "$out" | sed -n 's/^decode nominal .*: \([0-9.]*\) tok\/s.*/\1/p')
  summary+=("$(printf '%-34s prefill %9s tok/s   decode %8s tok/s   floor %8s tok/s' "$label" "${pre:-?}" "${dec:-?}" "${floor:-?}")")
}

# start_to_ready DIR: seconds from `inferd serve --device cuda` to its URL line.
start_to_ready() {
  local log t0 t
  log=$(mktemp)
  t0=$(date +%s.%N)
  "$bin"/inferd serve "$1" --device cuda --port 0 >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 1200); do
    grep -q "serving .* at http" "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  t=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }")
  grep -q "serving .* at http" "$log" && echo "$t" || { echo "failed"; cat "$log" >&2; }
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  rm -f "$log"
}

if has_stage serve; then
  echo "== serve: the house model on the GPU answers a chat"
  log=$(mktemp)
  "$bin"/inferd serve models/house --device cuda --port 0 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "serving .* at http" "$log" && break; sleep 0.05; done
  url=$(sed -n 's/.* at \(http:[^ ]*\)$/\1/p' "$log" | head -1)
  python3 - "$url" <<'PY'
import json, sys, urllib.request
def post(body):
    req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read().decode())
msgs = [{"role": "user", "content": "In the beginning"}]
print(json.dumps(post({"messages": msgs, "max_tokens": 40, "temperature": 0})))
# sampled on the GPU with penalties, a logit bias and logprobs: every token reported
r = post({"messages": msgs, "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "top_k": 40,
          "seed": 7, "frequency_penalty": 0.5, "logit_bias": {"11": -100},
          "logprobs": True, "top_logprobs": 5})
lp = r["choices"][0]["logprobs"]["content"]
ok = len(lp) == r["usage"]["completion_tokens"] and all(len(t["top_logprobs"]) == 5 for t in lp)
print("sampled with logprobs:", r["usage"]["completion_tokens"], "tokens,", "ok" if ok else "MISMATCH")
PY
  kill -TERM $pid; wait $pid; echo "serve exit status $?"; rm -f "$log"
  echo "-- continuous batching, house model"
  python3 bench/serve_concurrency.py "$bin"/inferd models/house --device cuda --streams 1,4,16,64
  echo "-- server tax, house model"
  python3 bench/serve_tax.py "$bin"/inferd models/house --device cuda --prompt-len 128 --gen-len 128 --reps 5
fi

if has_stage cache; then
  echo "== cache: prefix-cache hits against cold runs (bench/cache_check.py)"
  for preset in tiny-llama tiny-mistral tiny-qwen2 tiny-qwen3 tiny-qwen3-gqa1 tiny-llama3 tiny-llama-linear "${models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir" # prompts are token ids: any tokenizer serves the check
    for mode in exact fast; do
      echo "-- $preset, $mode"
      timeout 300 python3 bench/cache_check.py "$bin"/inferd "$dir" --device cuda --mode $mode --prompts 24 --gen-len 12
    done
  done
fi

for preset in "${models[@]}"; do
  if has_stage serve; then
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    echo "-- $preset: serve start to ready (page cache): $(start_to_ready "$dir") s"
    echo "-- $preset: server tax"
    python3 bench/serve_tax.py "$bin"/inferd "$dir" --device cuda --prompt-len 512 --gen-len 128 --reps 3
  fi
  if has_stage bench || has_stage 8k || has_stage profile; then
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
  fi
  if has_stage bench; then
    bench_one "$preset pp512+tg128" "$dir" --prompt-len 512 --gen-len 128 --reps 3
    bench_one "$preset pp512, f32 attention" "$dir" --prompt-len 512 --gen-len 4 --reps 2 --cuda-prefill-tc off
    if [ "$preset" = llama-3.1-8b ]; then
      bench_one "$preset pp4096" "$dir" --prompt-len 4096 --chunk 4096 --gen-len 4 --reps 3
      bench_one "$preset pp4096, f32 attention" "$dir" --prompt-len 4096 --chunk 4096 --gen-len 4 --reps 2 --cuda-prefill-tc off
      echo "-- $preset: load from page cache (inferd run --device cuda --tokens 1 -n 1)"
      "$bin"/inferd run "$dir" --device cuda --tokens 1 -n 1 2>&1 | grep -E "load|error" | tail -2
    fi
  fi
  if has_stage profile; then
    dir=$(make_model "$preset") || continue
    for fusion in off on; do
      echo "-- $preset: rmsnorm fusion $fusion: 512-token prompt, 128 decode steps from graphs"
      timeout 300 "$bin"/inferd bench "$dir" --device cuda --prompt-len 512 --gen-len 128 --reps 1 \
        --cuda-norm-fusion $fusion --cuda-profile graphs 2>&1 | grep -E "profile|decode  |prefill  "
      echo "-- $preset: rmsnorm fusion $fusion: eager with a timer per launch (prompt 512, 32 decode steps)"
      timeout 300 "$bin"/inferd bench "$dir" --device cuda --prompt-len 512 --gen-len 32 --reps 1 \
        --cuda-norm-fusion $fusion --cuda-profile ops 2>&1 | grep -E "profile: [a-z]|decode  "
    done
  fi
  if has_stage 8k; then
    bench_one "$preset 8k ctx (tg128)" "$dir" --prompt-len 8192 --chunk 2048 --gen-len 128 --reps 1
  fi
done

if has_stage agent; then
  for preset in "${agent_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    for conc in ${AGENT_CONCURRENCY:-4 16}; do
      echo "== agent: $preset, 16 sessions x 8 turns, system prompt 2,000 tokens, $conc sessions at a time${AGENT_SERVER_ARG:+, serve $AGENT_SERVER_ARG}"
      timeout 1200 python3 bench/agent_workload.py "$bin"/inferd "$dir" --device cuda \
        --sessions 16 --turns 8 --system-tokens 2000 --concurrency $conc \
        ${AGENT_SERVER_ARG:+--server-arg "$AGENT_SERVER_ARG"}
    done
    echo "== agent: $preset, throughput: 512-token prompts, 128 tokens, 1-64 streams"
    timeout 900 python3 bench/serve_concurrency.py "$bin"/inferd "$dir" --device cuda \
      --streams 1,8,16,32,64 --prompt-len 512 --gen-len 128
  done
fi

if has_stage rows; then
  for preset in "${agent_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    for rows in 8 4 2 1; do
      echo "== rows: $preset, --cuda-gemv-rows $rows, 512-token prompts, 128 tokens"
      timeout 600 python3 bench/serve_concurrency.py "$bin"/inferd "$dir" --device cuda \
        --streams 1,2,4,8,16 --prompt-len 512 --gen-len 128 --server-arg "--cuda-gemv-rows $rows"
    done
  done
fi

if has_stage ssd; then
  plen=${SSD_PROMPT_LEN:-16000}
  for preset in "${agent_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    for how in ${SSD_RESTORE_MODES:-auto always never}; do
      echo "== ssd: $preset, restart with a ${plen}-token prefix, --ssd-restore $how"
      extra=(--cold-off)
      [ "$how" = auto ] || extra=(--server-arg "--ssd-restore $how")
      timeout 900 python3 bench/ssd_restart.py restart "$bin"/inferd "$dir" --prompt-len "$plen" \
        "${extra[@]}" --server-arg "--device cuda" --server-arg "--max-batch 4"
    done
    [ "${SSD_DECODE:-1}" = 1 ] || continue
    echo "== ssd: $preset, decode beside write-behind against the tier off"
    timeout 900 python3 bench/ssd_restart.py decode "$bin"/inferd "$dir" --prompt-len 2048 \
      --gen-len 128 --rounds 3 --server-arg "--device cuda" --server-arg "--max-batch 4"
  done
fi

if has_stage structured; then
  for preset in "${agent_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    echo "== structured: $preset, a JSON schema against the same prompt unconstrained, batch 1"
    timeout 600 python3 bench/structured_bench.py "$bin"/inferd "$dir" --device cuda --rounds 5
    echo "== structured: $preset, the same without jump-forward (the masks' cost alone)"
    timeout 600 python3 bench/structured_bench.py "$bin"/inferd "$dir" --device cuda --rounds 5 \
      --server-arg=--no-jump-forward
  done
fi

if has_stage tp; then
  echo "== tensor parallelism through NCCL (tests/unit/test_tensor_parallel.c)"
  if [ -z "${INFERD_NCCL_LIB:-}" ]; then
    nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [ -n "$nccl" ] && [ -f "$nccl" ] || nccl=$(find /usr/local/cuda*/ /usr/lib $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nccl" ] && export INFERD_NCCL_LIB=$nccl
  fi
  echo "NCCL: ${INFERD_NCCL_LIB:-not found}"
  timeout 300 "$bin"/test_tensor_parallel --verbose=1 --jobs=1 2>&1 | grep -E "NCCL|N=|PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
fi

if has_stage spec; then
  echo "== spec: house + house-draft and prompt lookup, batch 1, against plain decoding"
  SPEC_REPS=${SPEC_REPS:-5} timeout 900 bench/spec_bench.sh "$bin"/inferd -- --device cuda
  dir=$(make_model llama-3.1-8b) || echo "mkmodel llama-3.1-8b failed"
  if [ -n "$dir" ]; then
    add_tokenizer llama-3.1-8b "$dir"
    echo "== spec: llama-3.1-8b, one verify step (1 + 4 tokens: every row's logits, then greedy picks on the device) against one decode step"
    timeout 600 "$bin"/inferd bench "$dir" --device cuda --prompt-len 512 --gen-len 16 --reps 9 \
      --verify-cost 4
  fi
  echo "== spec: house, 16 concurrent streams, speculation off then on (--draft-model models/house-draft)"
  timeout 600 python3 bench/serve_concurrency.py "$bin"/inferd models/house --device cuda \
    --streams 16 --prompt-len 128 --gen-len 128
  timeout 600 python3 bench/serve_concurrency.py "$bin"/inferd models/house --device cuda \
    --streams 16 --prompt-len 128 --gen-len 128 --server-arg "--draft-model models/house-draft"
  if [ -n "$dir" ]; then
    echo "== spec: llama-3.1-8b, 16 concurrent streams, off then prompt lookup (acceptance near zero)"
    timeout 900 python3 bench/serve_concurrency.py "$bin"/inferd "$dir" --device cuda \
      --streams 16 --prompt-len 512 --gen-len 128
    timeout 900 python3 bench/serve_concurrency.py "$bin"/inferd "$dir" --device cuda \
      --streams 16 --prompt-len 512 --gen-len 128 --server-arg "--draft-kind ngram"
  fi
fi

if has_stage kvquant; then
  for preset in "${agent_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    add_tokenizer "$preset" "$dir"
    for fmt in ${KVQ_FORMATS:-off 8 turbo turbo:k4v3 4}; do
      echo "== kvquant: $preset --kv-quant $fmt"
      # bytes per token from /stats.kv_quant of a short-lived server, and the
      # 8k-token sequences a 32 GB KV budget holds at that size
      timeout 900 python3 bench/serve_concurrency.py "$bin"/inferd "$dir" --device cuda \
        --streams 32 --prompt-len 8192 --gen-len ${KVQ_GEN_LEN:-1024} \
        --server-arg "--kv-quant $fmt" --server-arg "--max-batch 32" \
        --server-arg "--kv-budget 200" --server-arg "--ctx $((8192 + ${KVQ_GEN_LEN:-1024} + 256))"
      # (each bench's output names the cache's bytes per token: its "kv cache" line)
      bench_one "$preset kv=$fmt 32k prompt, batch 1" "$dir" --prompt-len 32768 --gen-len 64 \
        --reps 1 --kv-quant "$fmt"
      bench_one "$preset kv=$fmt prefill 4k" "$dir" --prompt-len 4096 --gen-len 8 --reps 2 \
        --kv-quant "$fmt"
    done
  done
fi

if has_stage quant; then
  echo "== quant: block-quantized weights on the GPU (tests/unit/test_cuda_quant.c)"
  if [ -x "$bin"/test_cuda_quant ]; then
    timeout 600 "$bin"/test_cuda_quant --verbose=1 --jobs=1 2>&1 |
      grep -E "tokens|rms|PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
  else
    echo "no $bin/test_cuda_quant"
  fi
  for spec in ${QUANT_FILES:-llama-3.1-8b:q8_0 llama-3.1-8b:q4_k_m llama-3.2-1b:q4_k_m}; do
    preset=${spec%%:*} dtype=${spec##*:}
    file=$models_dir/$preset-$dtype.gguf
    if [ ! -f "$file" ]; then
      t0=$(date +%s.%N)
      "$bin"/inferd mkmodel --preset "$preset" --seed 1 --format gguf --dtype "$dtype" \
        --out "$file" >/dev/null || { echo "mkmodel $preset $dtype failed"; continue; }
      echo "mkmodel $preset --format gguf --dtype $dtype: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s, $(du -h "$file" | cut -f1)"
    fi
    echo "== quant: $preset $dtype (weight bytes per token and the floor: the decode line)"
    bench_one "$preset $dtype decode tg128" "$file" --prompt-len 16 --gen-len 128 --reps 3
    [ "${QUANT_DP4A:-1}" != 0 ] &&
      bench_one "$preset $dtype decode tg128, dp4a" "$file" --prompt-len 16 --gen-len 128 --reps 3 \
        --cuda-qgemv dp4a
    [ "${QUANT_FLOAT:-1}" != 0 ] &&
      bench_one "$preset $dtype decode tg128, float" "$file" --prompt-len 16 --gen-len 128 --reps 3 \
        --cuda-qgemv float
    [ "${QUANT_PREFILL:-1}" != 0 ] &&
      bench_one "$preset $dtype prefill pp512" "$file" --prompt-len 512 --gen-len 1 --reps 3
  done
fi

if has_stage moe; then
  if [ "${MOE_TEST:-1}" != 0 ]; then
    echo "== moe: the MoE kernels against the CPU backend (tests/unit/test_cuda_moe.c)"
    if [ -x "$bin"/test_cuda_moe ]; then
      timeout 1800 "$bin"/test_cuda_moe --verbose=1 --jobs=1 2>&1 |
        grep -E "cuda moe:|worst|PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
    else
      echo "no $bin/test_cuda_moe"
    fi
  fi
  if [ "${MOE_BENCH:-1}" != 0 ]; then
    # 61 GB of bf16: RAM-backed /dev/shm when it holds it with room to spare
    # (the loader maps the files; the page cache would hold a disk copy too)
    moe_dir=
    shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
    if [ -f /dev/shm/inferd-models/qwen3-30b-a3b/.complete ] ||
       [ "${shm_kb:-0}" -ge $((60 * 1024 * 1024)) ]; then
      moe_dir=/dev/shm/inferd-models/qwen3-30b-a3b
    else
      disk_kb=$(df -Pk "$models_dir" | awk 'NR == 2 { print $4 }')
      if [ -f "$models_dir/qwen3-30b-a3b/.complete" ] || [ "${disk_kb:-0}" -ge $((60 * 1024 * 1024)) ]; then
        moe_dir=$models_dir/qwen3-30b-a3b
      fi
    fi
    if [ -z "$moe_dir" ]; then
      echo "== moe: no room for qwen3-30b-a3b (60 GB) in /dev/shm ($((${shm_kb:-0} / 1048576)) GB free) or $models_dir"
    else
      echo "== moe: qwen3-30b-a3b in $moe_dir"
      mkdir -p "$(dirname "$moe_dir")"
      if [ ! -f "$moe_dir/.complete" ]; then
        rm -rf "$moe_dir"
        t0=$(date +%s.%N)
        if "$bin"/inferd mkmodel --preset qwen3-30b-a3b --seed 1 --out "$moe_dir" >/dev/null; then
          touch "$moe_dir/.complete"
          echo "mkmodel qwen3-30b-a3b: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s, $(du -sh "$moe_dir" | cut -f1)"
        else
          echo "mkmodel qwen3-30b-a3b failed"
        fi
      fi
      if [ -f "$moe_dir/.complete" ]; then
        bench_one "qwen3-30b-a3b pp512+tg128" "$moe_dir" --prompt-len 512 --gen-len 128 --reps 3
        bench_one "qwen3-30b-a3b tg128, first kernels" "$moe_dir" --prompt-len 512 --gen-len 128 --reps 1 --cuda-moe off
        bench_one "qwen3-30b-a3b pp4096" "$moe_dir" --prompt-len 4096 --chunk 4096 --gen-len 4 --reps 3
        bench_one "qwen3-30b-a3b pp4096, first kernels" "$moe_dir" --prompt-len 4096 --chunk 4096 --gen-len 4 --reps 1 --cuda-moe off
      fi
      rm -rf "$moe_dir"
      echo "deleted $moe_dir"
    fi
    if dir=$(make_model gemma-3-4b); then
      bench_one "gemma-3-4b pp512+tg128" "$dir" --prompt-len 512 --gen-len 128 --reps 3
    else
      echo "mkmodel gemma-3-4b failed"
    fi
  fi
fi

if has_stage lora; then
  echo "== lora: the CUDA op against the CPU (tests/unit/test_lora.c lora_cuda)"
  tl=$bin/test_lora
  [ -x "$tl" ] || tl=build/test_lora
  if [ -x "$tl" ]; then
    timeout 300 "$tl" --filter 'lora_cuda/*' --verbose=1 --jobs=1 2>&1 |
      grep -E "PASS|FAIL|SKIP|Synthesis|expected|assert|signal|Crash|error"
  else
    echo "no test_lora in $bin or build"
  fi
  for preset in "${lora_models[@]}"; do
    dir=$(make_model "$preset") || { echo "mkmodel $preset failed"; continue; }
    echo "== lora: $preset, 16 sequences over N distinct rank-16 adapters against none"
    timeout 600 "$bin"/inferd bench "$dir" --device cuda --adapters 0,1,4,16 --rank 16 \
      --batch 16 --prompt-len 64 --gen-len 65 --reps 5 2>&1 | grep -E "adapters|adapter |load|error"
  done
fi

echo "== summary (floor = weight bytes per token / 4.6 TB/s)"
for line in "${summary[@]}"; do echo "$line"; done
