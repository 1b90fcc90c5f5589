#!/usr/bin/env bash
# bench/tokenizer_speed.sh — encode speed of our C tokenizer vs the HF Rust reference on ~10 MB of mixed text, per tokenizer.
#
# Usage: bench/tokenizer_speed.sh [BUILD_DIR] [MB]    (defaults: build, 10)
# Both sides encode the same NUL-separated ~4 KB documents on one thread without special tokens:
# C one tok_encode call per document, Rust (npm tokenizers@0.23.2, the N-API binding) one
# encodeBatch call with TOKENIZERS_PARALLELISM=false.
# Prints MB/s for both, the ratio C/Rust, and whether the token counts agree.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MB=${2:-10}
DATA=$BUILD/text-data

[ -d tests/node/node_modules/tokenizers ] || npm ci --prefix tests/node --no-audit --no-fund
scripts/fetch-tokenizers.sh "$DATA" >/dev/null
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD" tokenizer_bench >/dev/null 2>&1 || ninja -C "$BUILD" tokenizer_bench

docs=$(mktemp)
trap 'rm -f "$docs"' EXIT
printf '%-7s %10s %10s %8s  %s\n' tokenizer "rust MB/s" "C MB/s" "C/rust" "tokens (rust / C)"
for name in qwen3 llama3 gemma3; do
    rust=$(TOKENIZERS_PARALLELISM=false node bench/tokenizer_speed.js "$DATA" "$name" "$docs" "$MB")
    c=$("$BUILD/tokenizer_bench" "$DATA/$name" "$name" "$docs")
    field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
    rmb=$(field mb_per_s "$rust"); cmb=$(field mb_per_s "$c")
    rt=$(field tokens "$rust"); ct=$(field tokens "$c")
    ratio=$(awk -v a="$cmb" -v b="$rmb" 'BEGIN { printf "%.2f", a / b }')
    printf '%-7s %10s %10s %8s  %s / %s%s\n' "$name" "$rmb" "$cmb" "$ratio" "$rt" "$ct" \
        "$([ "$rt" = "$ct" ] || echo '  (token counts differ!)')"
done
