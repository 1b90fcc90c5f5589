#!/usr/bin/env bash
# tests/smoke/make-run.sh — `make run` serves the default model: start it on a free port, ask
# for a short completion, require non-empty valid UTF-8 text, stop it with Ctrl-C (SIGINT).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
setsid make --no-print-directory run PORT="$port" >"$log" 2>&1 &
pgid=$!
cleanup() { kill -INT -- "-$pgid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT

for _ in $(seq 1 600); do
    grep -q "serving .* at http://" "$log" && break
    kill -0 "$pgid" 2>/dev/null || { cat "$log"; echo "smoke: make run exited" >&2; exit 1; }
    sleep 0.1
done
grep -q "serving .* at http://127.0.0.1:$port" "$log" || { cat "$log"; echo "smoke: make run did not print its URL" >&2; exit 1; }
grep -q "curl http://127.0.0.1:$port/v1/chat/completions" "$log" || { echo "smoke: no example curl printed" >&2; exit 1; }

reply=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "In the beginning", "max_tokens": 16, "temperature": 0}')
python3 - "$reply" <<'PY'
import json, sys
text = json.loads(sys.argv[1])["choices"][0]["text"]
text.encode("utf-8")  # json already refused invalid UTF-8; this catches lone surrogates
assert text.strip(), "empty completion"
print(f"smoke: make run answered {text!r}")
PY

kill -INT -- "-$pgid"
for _ in $(seq 1 100); do kill -0 "$pgid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pgid" 2>/dev/null; then echo "smoke: make run did not stop on SIGINT" >&2; exit 1; fi
echo "smoke: make run stopped cleanly"
