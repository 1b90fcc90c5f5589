#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent:
# packages already present are left alone and nothing is fetched.
set -euo pipefail

debian_packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev llvm
  libjson-c-dev libcriterion-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
  libsqlite3-dev libxxhash-dev
  python3
)

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Node.js and npm run the reference tokenizer and template engines in tests;
# a machine may already have them from another source, which is fine.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
