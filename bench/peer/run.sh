#!/usr/bin/env bash
# bench/peer/run.sh — inferd and llama.cpp on the same GGUF file, runs alternated, medians of N rounds.
#
# Usage: bench/peer/run.sh [-n ROUNDS] [-t THREADS] [-p PROMPT_LENS] [-g GEN] [-i INFERD] FILE.gguf...
#   PROMPT_LENS: comma-separated prompt lengths (default 128,512); each round
#   runs, per file, `inferd bench FILE` and bench.mjs once per prompt length,
#   in alternating order (inferd first in odd rounds, llama.cpp first in even
#   ones), so drifting load on a shared machine falls on both alike.
# Prints, per file: the CPU's ISA (ours and the ggml variant llama.cpp
# loaded), the read bandwidth inferd measured before each decode, the
# floor (weight bytes per token / that bandwidth), the load average, and one
# row per phase in bench/RESULTS.md's form:
#   | Qwen3-0.6B Q4_K_M decode | inferd X | llama.cpp Y | Z× |
# The raw figures of every run go to $OUT_DIR (default bench/peer/out).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rounds=5 threads=2 prompts=128,512 gen=32 inferd="$root/build/inferd"
while getopts "n:t:p:g:i:" o; do
    case $o in
    n) rounds=$OPTARG ;; t) threads=$OPTARG ;; p) prompts=$OPTARG ;; g) gen=$OPTARG ;;
    i) inferd=$OPTARG ;; *) sed -n 3,15p "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 3,15p "$0"; exit 2; }
[ -d "$here/node_modules/node-llama-cpp" ] || (cd "$here" && npm ci --ignore-scripts --no-audit --no-fund)
out="${OUT_DIR:-$here/out}"
mkdir -p "$out"
IFS=, read -r -a plens <<<"$prompts"

echo "cpu              $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) logical CPUs"
echo "isa flags        $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16)$' | tr '\n' ' ')"

run_inferd() { # file plen round
    "$inferd" bench "$1" --threads "$threads" --prompt-len "$2" --gen-len "$gen" --reps 1 \
        >"$out/inferd-$(basename "$1" .gguf)-p$2-r$3.txt" 2>&1
}
run_peer() {
    node "$here/bench.mjs" "$1" --threads "$threads" --prompt-len "$2" --gen-len "$gen" \
        >"$out/llama-$(basename "$1" .gguf)-p$2-r$3.json" 2>"$out/llama-$(basename "$1" .gguf)-p$2-r$3.err"
}

for f in "$@"; do
    for r in $(seq 1 "$rounds"); do
        for p in "${plens[@]}"; do
            if [ $((r % 2)) = 1 ]; then run_inferd "$f" "$p" "$r"; run_peer "$f" "$p" "$r"
            else run_peer "$f" "$p" "$r"; run_inferd "$f" "$p" "$r"; fi
        done
        echo "round $r/$rounds of $(basename "$f") done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    done
    python3 - "$out" "$f" "$rounds" "$gen" "$prompts" <<'PY'
import json, re, sys, statistics, os
out, f, rounds, gen, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5].split(",")
base = os.path.basename(f)[:-5]
def num(pat, text):
    m = re.search(pat, text)
    return float(m.group(1)) if m else float("nan")
name = base.replace("qwen3-0.6b", "Qwen3-0.6B").replace("llama-3.2-1b", "Llama-3.2-1B")
name = re.sub(r"-(bf16|q8_0|q4_k_m|q4_0|q6_k)$", lambda m: " " + m.group(1).upper(), name)
dec_i, dec_l, bw, floor, mb, variant, isa = [], [], [], [], None, "?", "?"
rows = []
for p in prompts:
    pre_i, pre_l = [], []
    for r in range(1, rounds + 1):
        t = open(f"{out}/inferd-{base}-p{p}-r{r}.txt").read()
        j = json.loads(open(f"{out}/llama-{base}-p{p}-r{r}.json").read().strip().splitlines()[-1])
        pre_i.append(num(r"prefill\s+\d+ tokens[^:]*: ([\d.]+) tok/s", t))
        pre_l.append(j["prefill_tps"])
        dec_i.append(num(r"decode\s+\d+ tokens: ([\d.]+) tok/s", t))
        dec_l.append(j["decode_tps"])
        bw.append(num(r"read bandwidth\s+([\d.]+) GB/s", t))
        floor.append(num(r"floor ([\d.]+) tok/s", t))
        mb = num(r"\(([\d.]+) MB/token\)", t)
        m = re.search(r"cpu\s+(\S+),", t); isa = m.group(1) if m else isa
        variant = j.get("cpu_variant", variant)
    mi, ml = statistics.median(pre_i), statistics.median(pre_l)
    rows.append(f"| {name} prefill {p} | inferd {mi:.1f} | llama.cpp {ml:.1f} | {mi / ml:.2f}× |")
mi, ml = statistics.median(dec_i), statistics.median(dec_l)
rows.insert(0, f"| {name} decode | inferd {mi:.1f} | llama.cpp {ml:.1f} | {mi / ml:.2f}× | floor {statistics.median(floor):.1f} tok/s ({mb:.0f} MB/token at {statistics.median(bw):.1f} GB/s) |")
print(f"\n{base}: inferd isa {isa}, llama.cpp ggml-cpu-{variant}; {rounds} rounds, medians (tok/s)")
print("\n".join(rows))
PY
done
echo "load average     $(cut -d' ' -f1-3 /proc/loadavg)"
