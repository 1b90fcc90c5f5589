#!/usr/bin/env bash
# bench/spec_bench.sh — speculative decoding on this machine: the house pair (models/house with
# models/house-draft) greedy at batch 1 on held-out text, and prompt lookup (--draft-kind ngram)
# on a copy workload (a held-out KJV passage, then its first words again), each against the same
# run without speculation, alternating, medians of decode tok/s.
#
#   usage: bench/spec_bench.sh [INFERD] [-- extra `inferd run` flags, e.g. --device cuda]
#   Environment: SPEC_REPS (alternating pairs per prompt, default 5), SPEC_GEN (tokens, 128),
#   SPEC_PROMPTS (held-out prompts for the house pair, default 3), SPEC_DRAFT_VOCAB (the
#   house pair's second run: --draft-vocab, default all, against the first run's automatic head).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
inferd=${1:-build/inferd}
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")
reps=${SPEC_REPS:-5}
gen=${SPEC_GEN:-128}
n_prompts=${SPEC_PROMPTS:-3}
draft_vocab=${SPEC_DRAFT_VOCAB:-all}
heldout=tests/goldens/house/heldout.txt
[ -x "$inferd" ] || { echo "no inferd at $inferd" >&2; exit 1; }

# decode tok/s, the process's CPU seconds and the speculation line of one `inferd run`
# (stderr); its text goes to $tmp/last. CPU time counts what the run computed whatever else
# the machine runs (with --threads 1 it is the work; wall time shares the cores).
run_once() {
  local out
  out=$(/usr/bin/time -f "cputime %U %S" "$inferd" run models/house "${extra[@]}" -n "$gen" "$@" 2>&1 >"$tmp/last")
  local tps acc cpu
  tps=$(sed -n 's/.*decode [0-9]* tokens \([0-9.]*\) tok\/s.*/\1/p' <<<"$out")
  acc=$(sed -n 's/.*speculation: \([0-9]*\) drafted, \([0-9]*\) accepted.*/\1 \2/p' <<<"$out")
  cpu=$(awk '/^cputime/ { print $2 + $3 }' <<<"$out")
  echo "$tps ${acc:-0 0} $cpu"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Alternates plain and speculating runs of one prompt; prints the medians and the acceptance.
compare() {
  local label=$1 prompt=$2
  shift 2
  local plain=() spec=() plain_cpu=() spec_cpu=() drafted=0 accepted=0 same=yes
  for ((r = 0; r < reps; r++)); do
    read -r p _ _ pc < <(run_once -p "$prompt")
    cp "$tmp/last" "$tmp/plain"
    read -r s d a sc < <(run_once -p "$prompt" "$@")
    cmp -s "$tmp/plain" "$tmp/last" || same=no
    plain+=("$p")
    spec+=("$s")
    plain_cpu+=("$pc")
    spec_cpu+=("$sc")
    drafted=$((drafted + d))
    accepted=$((accepted + a))
  done
  local mp ms mpc msc
  mp=$(printf '%s\n' "${plain[@]}" | median)
  ms=$(printf '%s\n' "${spec[@]}" | median)
  mpc=$(printf '%s\n' "${plain_cpu[@]}" | median)
  msc=$(printf '%s\n' "${spec_cpu[@]}" | median)
  awk -v l="$label" -v p="$mp" -v s="$ms" -v pc="$mpc" -v sc="$msc" -v d="$drafted" -v a="$accepted" -v same="$same" 'BEGIN {
    printf "%-28s plain %6.1f tok/s  spec %6.1f tok/s  speedup %.2fx  cpu %.2fs/%.2fs = %.2fx  acceptance %.0f%% (%d of %d)  same text: %s\n",
      l, p, s, s / p, pc, sc, (sc > 0 ? pc / sc : 0), d ? 100 * a / d : 0, a, d, same }'
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== $(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; ${gen} tokens, ${reps} alternating pairs"

# Held-out prompts: the first 30 words of verses spread over the file, those whose plain
# continuation runs the whole length (one that ends at once times nothing).
prompts=()
while IFS= read -r line && [ ${#prompts[@]} -lt "$n_prompts" ]; do
  words=$(cut -d' ' -f1-30 <<<"$line")
  read -r _ < <(run_once -p "$words")
  [ "$(wc -w <"$tmp/last")" -ge $((gen / 2)) ] && prompts+=("$words")
done < <(awk 'length($0) > 200 && length($0) < 400' "$heldout" | awk 'NR % 13 == 1')
echo "-- house + house-draft, greedy, batch 1 (--draft-model models/house-draft: K 3 adaptive, the head's rows chosen as it runs)"
for i in "${!prompts[@]}"; do
  compare "held-out prompt $((i + 1))" "${prompts[$i]}" --draft-model models/house-draft
done
# The draft's LM head (8,192 x 192) is two thirds of its weights: the automatic head reads the
# rows that held most of its picks (the BPE vocabulary's most frequent ids); all: every row.
echo "-- the same, --draft-vocab $draft_vocab"
for i in "${!prompts[@]}"; do
  compare "held-out prompt $((i + 1))" "${prompts[$i]}" --draft-model models/house-draft \
    --draft-vocab "$draft_vocab"
done

# The copy workload: a passage, a blank line, then its first words again.
passage=$(awk 'length($0) > 150' "$heldout" | sed -n '40,44p' | tr '\n' ' ')
start=$(cut -d' ' -f1-8 <<<"$passage")
echo "-- prompt lookup on the copy workload (--draft-kind ngram, K 10 adaptive)"
compare "copy workload" "$passage

$start" --draft-kind ngram
compare "copy workload, draft model" "$passage

$start" --draft-model models/house-draft
