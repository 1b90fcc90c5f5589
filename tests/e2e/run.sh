#!/usr/bin/env bash
# tests/e2e/run.sh — runs the e2e, responses and embeddings (openai SDK), anthropic (Anthropic SDK), bad-input (raw sockets), load, SSD-tier, speculative-decoding and web-page (headless Chromium) suites against a real `inferd serve`.
#
# Usage: tests/e2e/run.sh [--sanitize | --rest] [INFERD [MODEL_DIR]]
#   INFERD     the inferd binary (default $INFERD or build/inferd); built by the caller, never here
#   MODEL_DIR  the test model (default $E2E_MODEL or build/models/e2e-qwen3); when it is missing
#              or older than INFERD it is (re)made with `INFERD mkmodel --preset tiny-qwen3
#              --tokenizer $E2E_TOKENIZER` (default build/text-data/qwen3, from `make text-data`)
#   --sanitize for an AddressSanitizer/UBSan build: e2e, bad_input, ssd, audio and pool
#              run; fails when any server's stderr holds a sanitizer report
#   --rest     every default suite but those (make test runs both passes: each suite once)
# Environment: E2E_SUITES (default "e2e responses embeddings anthropic structured bad_input load ssd spec webui audio speech pool adapters isolate"; ssd, pool, adapters and isolate start their own
# servers over fresh cache directories, and runs bench/ssd_kill.sh shortened; webui starts its own server of
# models/house with an API key and drives the chat page in Debian's /usr/bin/chromium, skipped with a message
# when that is missing unless CI=true, and saves screenshots in INFERD_E2E_ARTIFACTS, default
# build/e2e-artifacts), E2E_SERVE_ARGS (extra `serve` flags),
# E2E_LOG_DIR (kept; default a fresh temporary directory, removed when everything passed),
# INFERD_E2E_LOAD_CLIENTS / INFERD_E2E_LOAD_SECONDS (the load suite's size), INFERD_E2E_SSD_KILLS
# (kill -9 iterations in the ssd suite; default 5, 2 under a sanitizer).
#
# Steps: `npm ci` into tests/e2e/node_modules when the pinned openai or @anthropic-ai/sdk is not
# installed; start `inferd serve MODEL --port 0`, read its URL from stdout, wait for GET /health
# == 200; run each suite with `node --test`; send SIGTERM and require exit status 0 within 10 s.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

say() { echo "e2e: $*"; }
die() { echo "e2e: $*" >&2; exit 1; }
# An absolute path: arguments are taken from the caller's directory, defaults from the repository's.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$2/$1" ;; esac; }

sanitize=0 rest=0
case "${1:-}" in
--sanitize) sanitize=1; shift ;;
--rest) rest=1; shift ;;
esac
if [ -n "${1:-}" ]; then INFERD=$(absolute "$1" "$PWD"); else INFERD=$(absolute "${INFERD:-build/inferd}" "$root"); fi
if [ -n "${2:-}" ]; then MODEL=$(absolute "$2" "$PWD"); else MODEL=$(absolute "${E2E_MODEL:-build/models/e2e-qwen3}" "$root"); fi
TOKENIZER=$(absolute "${E2E_TOKENIZER:-build/text-data/qwen3}" "$root")
ALL_SUITES="e2e responses embeddings anthropic structured bad_input load ssd spec webui audio speech pool adapters isolate"
# Under a sanitizer the default is the suites whose memory-owning paths no fuzzer reaches:
# requests and streams end to end, raw-socket bad input, the SSD tier's files and restarts,
# audio uploads, the model pool's loads and unloads. The others run in the plain pass only:
# their parsers are fuzzed, their engine paths are the unit tests', and instrumented they
# take minutes of the suite's time budget.
SANITIZED_SUITES="e2e bad_input ssd audio pool"
SUITES=$ALL_SUITES
[ $sanitize = 1 ] && SUITES=$SANITIZED_SUITES
if [ $rest = 1 ]; then
    SUITES=
    for s in $ALL_SUITES; do
        case " $SANITIZED_SUITES " in *" $s "*) ;; *) SUITES="$SUITES $s" ;; esac
    done
fi
SUITES=${E2E_SUITES:-$SUITES}
cd "$root"

[ -x "$INFERD" ] || die "no inferd binary at $INFERD (build it first)"
{ command -v node && command -v npm; } >/dev/null || die "node and npm are required (scripts/bootstrap.sh)"

# The pinned SDKs, exactly as package-lock.json says.
pinned() {
    local want have
    want=$(node -p "require('$here/package-lock.json').packages['node_modules/$1'].version")
    have=$(node -p "try { require('$here/node_modules/$1/package.json').version } catch { '' }")
    [ "$want" = "$have" ] || echo "$1 $want "
}
missing="$(pinned openai)$(pinned @anthropic-ai/sdk)$(pinned ajv)$(pinned puppeteer-core)$(pinned ws)"
if [ -n "$missing" ]; then
    say "npm ci ($missing)"
    (cd "$here" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

if [ ! -f "$MODEL/tokenizer.json" ] || [ ! -f "$MODEL/model.safetensors" ] ||
    [ "$INFERD" -nt "$MODEL/model.safetensors" ]; then
    [ -f "$TOKENIZER/tokenizer.json" ] || die "no tokenizer in $TOKENIZER (run make text-data)"
    say "making the test model $MODEL"
    "$INFERD" mkmodel --preset tiny-qwen3 --tokenizer "$TOKENIZER" --out "$MODEL"
fi
MODEL=$(cd "$MODEL" && pwd)

logs=${E2E_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/inferd-e2e.XXXXXX")}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

if [ $sanitize = 1 ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=0}
    export INFERD_E2E_SANITIZE=1
fi
export INFERD_BINARY=$INFERD INFERD_E2E_MODEL=$MODEL INFERD_E2E_LOG_DIR=$logs
export INFERD_E2E_ARTIFACTS=${INFERD_E2E_ARTIFACTS:-$root/build/e2e-artifacts}

server_pid=
stop_server() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
}
trap stop_server EXIT

# shellcheck disable=SC2086
"$INFERD" serve "$MODEL" --host 127.0.0.1 --port 0 ${E2E_SERVE_ARGS:-} >"$logs/main.out" 2>"$logs/main.err" &
server_pid=$!
limit=$((sanitize ? 240 : 60))
url=
for _ in $(seq $((limit * 10))); do
    url=$(sed -n 's/^inferd: serving [^ ]* at \(http:\/\/[^ ]*\).*$/\1/p' "$logs/main.out" | head -1)
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$logs/main.err" >&2; die "inferd serve exited before serving"; }
    sleep 0.1
done
[ -n "$url" ] || { tail -20 "$logs/main.err" >&2; die "no 'inferd: serving MODEL at URL' line on stdout within ${limit}s"; }
url=${url%/}
# shellcheck disable=SC2016
node -e '
const url = process.argv[1], deadline = Date.now() + Number(process.argv[2]) * 1000;
(async () => {
  let last = "";
  while (Date.now() < deadline) {
    try { const r = await fetch(url + "/health"); last = r.status; if (r.status === 200) return; } catch (e) { last = String(e.cause || e); }
    await new Promise((r) => setTimeout(r, 100));
  }
  console.error(`e2e: GET ${url}/health never answered 200 (last: ${last})`);
  process.exit(1);
})();' "$url" "$limit"
say "inferd serve (pid $server_pid) at $url; logs in $logs"
export INFERD_E2E_URL=$url INFERD_E2E_PID=$server_pid

failed=()
for suite in $SUITES; do
    say "suite $suite"
    # A test without its own timeout gets 2 minutes (6 under a sanitizer): a hang fails, not stalls.
    limit_ms=$((sanitize ? 360000 : 120000))
    # the structured-output suite runs a corpus of 200+ schemas twice
    [ "$suite" = structured ] && limit_ms=$((limit_ms * 4))
    if ! node --test --test-reporter=spec --test-timeout=$limit_ms "$here/$suite.test.mjs"; then
        failed+=("$suite")
    fi
done

say "SIGTERM to inferd serve"
kill -TERM "$server_pid"
t0=$(date +%s%N)
for _ in $(seq 100); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    failed+=("shutdown: still running 10 s after SIGTERM")
else
    status=0
    wait "$server_pid" || status=$?
    say "exited with status $status after $((($(date +%s%N) - t0) / 1000000)) ms"
    [ "$status" = 0 ] || failed+=("shutdown: exit status $status after SIGTERM")
fi
server_pid=

if [ $sanitize = 1 ]; then
    for f in "$logs"/*.err; do
        [ -f "$f" ] || continue
        if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer' "$f"; then
            echo "---- sanitizer report in $f" >&2
            grep -nE -A30 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f" | head -80 >&2
            failed+=("sanitizer report in $(basename "$f")")
        fi
    done
fi

if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED: ${failed[*]}"
    say "server logs kept in $logs"
    exit 1
fi
say "all passed: ${SUITES}$([ $sanitize = 1 ] && echo ' (sanitizer build, no reports)')"
[ -n "${E2E_LOG_DIR:-}" ] || rm -rf "$logs"
