#!/usr/bin/env bash
# Installs every Debian package the build and the tests need, and the npm packages the chat
# page's build bundles (web/node_modules, as web/package-lock.json pins them). Idempotent:
# packages already present are left alone and nothing is fetched.
set -euo pipefail

debian_packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev llvm
  libjson-c-dev libcriterion-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
  libsqlite3-dev libxxhash-dev libsndfile1-dev libsamplerate0-dev espeak-ng
  python3
  chromium
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

# The chat page (web/build.mjs, run by the build) bundles marked, DOMPurify and highlight.js with
# esbuild; `npm ci` when web/node_modules does not hold exactly what the lock file pins. Scripts
# are not run: esbuild's binary comes in its platform package.
web=$(cd "$(dirname "${BASH_SOURCE[0]}")/../web" && pwd)
web_pinned() {
    node -e '
const lock = require(process.argv[1] + "/package-lock.json");
for (const [name, want] of Object.entries(lock.packages[""].dependencies)) {
  let have = "";
  try { have = require(process.argv[1] + "/node_modules/" + name + "/package.json").version; } catch {}
  if (have !== lock.packages["node_modules/" + name].version) process.exit(1);
}' "$web"
}
if ! web_pinned; then
  echo "bootstrap: npm ci in web/ (the chat page's build)"
  (cd "$web" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
