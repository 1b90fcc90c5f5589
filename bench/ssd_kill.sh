#!/usr/bin/env bash
# bench/ssd_kill.sh — the SSD tier under kill -9, through a real server: each iteration starts
# `inferd serve --mode exact --ssd-cache DIR`, asks a fixed set of prompts and compares the
# answers with a cold server's (whatever the last kill left on disk is restored, or dropped and
# recomputed), then sends many distinct long prompts (heavy writing behind) and kills the server
# with SIGKILL at a random moment. A wrong answer, a server that dies on its own or will not
# start, or an error answer fails the run. The last iteration's server is stopped with SIGTERM
# and must exit 0. Prints what the store recovered at each start (from the server's log).
#   usage: bench/ssd_kill.sh [ITERATIONS (100)] [MODEL (build/models/e2e-qwen3)] [INFERD (build/inferd)]
#   environment: SSD_KILL_DIR (the cache directory; default a fresh temporary one, removed at
#   the end), SSD_KILL_LOGS (where the servers' logs go; default inside the work directory,
#   kept when the run fails).
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-100}
model=${2:-build/models/e2e-qwen3}
bin=${3:-build/inferd}
[ -x "$bin" ] || { echo "ssd_kill: no inferd at $bin" >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "ssd_kill: no model in $model (tests/e2e/run.sh makes it)" >&2; exit 2; }
command -v jq >/dev/null && command -v curl >/dev/null || { echo "ssd_kill: needs jq and curl" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/inferd-ssd-kill-XXXXXX")
dir=${SSD_KILL_DIR:-$work/cache}
logs=${SSD_KILL_LOGS:-$work/logs}
mkdir -p "$dir" "$logs"
pid= writers=()
cleanup() {
  for w in "${writers[@]}"; do kill "$w" 2>/dev/null || true; done
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
}
trap cleanup EXIT

# Starts a server (extra flags after the log name); sets pid and url, or returns 1.
start() {
  local log=$1; shift
  "$bin" serve "$model" --host 127.0.0.1 --port 0 --mode exact "$@" >"$log.out" 2>"$log.err" &
  pid=$!
  url=
  for _ in $(seq 600); do
    url=$(sed -n 's/^inferd: serving [^ ]* at \(http:\/\/[^ ]*\).*$/\1/p' "$log.out" | head -1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  [ -n "$url" ] || return 1
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

words=(river stone lantern orchard copper meadow harbour violet thunder candle marble
       falcon glacier saffron willow ember quartz tundra cobalt juniper)
# A long text that differs from its first word on: every block of it is new to the cache.
text() {
  local n=$2 out="" s
  s=$(cksum <<<"$1"); s=${s%% *}
  for _ in $(seq "$n"); do
    s=$(((s * 1103515245 + 12345) % 2147483648))
    out+="${words[$((s % ${#words[@]}))]} "
  done
  echo "$1: $out"
}

fixed=()
for k in 1 2 3 4; do fixed+=("$(text "fixed-$k" 120)"); done
body() { jq -nc --arg u "$1" --argjson n "$2" '{messages: [{role: "user", content: $u}], max_tokens: $n, temperature: 0}'; }
# The answer to prompt $1 as "cached_tokens<TAB>content", or "ERROR<TAB>..." on failure.
ask() {
  local r
  r=$(curl -s -m 60 -w '\n%{http_code}' -H 'content-type: application/json' -d "$(body "$1" 12)" \
    "$url/v1/chat/completions") || { printf 'ERROR\tcurl failed\n'; return; }
  local code=${r##*$'\n'}
  r=${r%$'\n'*}
  [ "$code" = 200 ] || { printf 'ERROR\tHTTP %s %s\n' "$code" "${r:0:200}"; return; }
  jq -r '[(.usage.prompt_tokens_details.cached_tokens // 0 | tostring), .choices[0].message.content] | join("\t")' <<<"$r"
}

date -u +"%Y-%m-%d %H:%M UTC"
echo "model $model, dir $dir ($(df -T "$dir" | awk 'NR==2 {print $2}')), $iters iterations, load average $(cut -d' ' -f1-3 /proc/loadavg)"
start "$logs/cold" --prompt-cache 0 || { echo "ssd_kill: the cold server did not start:"; tail -5 "$logs/cold.err"; exit 1; }
want=()
for p in "${fixed[@]}"; do
  a=$(ask "$p")
  [ "${a%%$'\t'*}" != ERROR ] || { echo "ssd_kill: cold server: $a"; exit 1; }
  want+=("${a#*$'\t'}")
done
kill -TERM "$pid"; wait "$pid" || true; pid=

wrong=0 crashes=0 errors=0 checked=0 reused=0 restored=0
recovered=0 dropped=0 rebuilt=0 torn=0 reaped=0 verify=0
for i in $(seq 1 "$iters"); do
  log=$logs/iter-$i
  if ! start "$log" --ssd-cache "$dir"; then
    crashes=$((crashes + 1)); echo "iteration $i: the server did not start:"; tail -5 "$log.err"
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=
    continue
  fi
  line=$(grep -m1 -E '^inferd info: ssd cache .*: [0-9]+ blocks' "$log.err" || true)
  r=$(sed -n 's/.*recovered \([0-9]*\), dropped \([0-9]*\).*/\1 \2/p' <<<"$line")
  recovered=$((recovered + ${r% *})); dropped=$((dropped + ${r#* }))
  grep -q '(index rebuilt)' <<<"$line" && rebuilt=$((rebuilt + 1))
  torn=$((torn + $(grep -c 'after its last good record cut off' "$log.err" || true)))
  reaped=$((reaped + $(grep -c 'reaped temporary file' "$log.err" || true)))
  for k in "${!fixed[@]}"; do
    a=$(ask "${fixed[$k]}")
    checked=$((checked + 1))
    if [ "${a%%$'\t'*}" = ERROR ]; then
      errors=$((errors + 1)); echo "iteration $i: prompt $k: $a"
    elif [ "${a#*$'\t'}" != "${want[$k]}" ]; then
      wrong=$((wrong + 1)); echo "iteration $i: prompt $k: WRONG ANSWER (cached ${a%%$'\t'*}): ${a#*$'\t'}"
    elif [ "${a%%$'\t'*}" -gt 0 ]; then
      reused=$((reused + 1))
    fi
  done
  read -r v b < <(curl -s "$url/stats" | jq -r '"\(.ssd_cache.verify_failures // 0) \(.ssd_cache.restores // 0)"')
  verify=$((verify + v)); restored=$((restored + b))
  if [ "$i" = "$iters" ]; then
    kill -TERM "$pid"; status=0; wait "$pid" || status=$?; pid=
    [ "$status" = 0 ] || { crashes=$((crashes + 1)); echo "iteration $i: exit status $status after SIGTERM"; }
    break
  fi
  # Heavy writing: 4 clients of distinct long prompts (the fixed ones among them), killed at
  # 0.1 to 2.1 s: start-up writes, steady write-behind and flushes alike.
  writers=()
  for c in 1 2 3 4; do
    ( n=0; while :; do
        n=$((n + 1))
        if [ $((n % 5)) = 0 ]; then p=${fixed[$(((n / 5 + c) % 4))]}; else p=$(text "w$i-$c-$n" 200); fi
        curl -s -o /dev/null -m 30 -H 'content-type: application/json' -d "$(body "$p" 4)" "$url/v1/chat/completions" || true
        [ $((n % 7)) = 0 ] && curl -s -o /dev/null -m 30 -X POST "$url/admin/cache/flush" || true
      done ) &
    writers+=($!)
  done
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.1 + 2 * r / 32767 }')"
  if ! kill -0 "$pid" 2>/dev/null; then
    crashes=$((crashes + 1)); echo "iteration $i: the server died on its own:"; tail -5 "$log.err"
  fi
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true; pid=
  for w in "${writers[@]}"; do kill "$w" 2>/dev/null || true; wait "$w" 2>/dev/null || true; done
  writers=()
done
echo "iterations $iters: wrong answers $wrong, crashes $crashes, errors $errors"
echo "answers checked $checked, $reused of them over cached K/V; blocks restored from disk $restored"
echo "at start-up: blocks recovered past the index $recovered, index rows dropped $dropped, index rebuilt $rebuilt times, torn segment tails cut $torn, temporary files reaped $reaped; reads that failed verification $verify"
if [ $wrong -eq 0 ] && [ $crashes -eq 0 ] && [ $errors -eq 0 ]; then
  [ -n "${SSD_KILL_DIR:-}" ] || rm -rf "$work"
  exit 0
fi
echo "logs kept in $logs"
exit 1
