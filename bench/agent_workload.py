#!/usr/bin/env python3
"""Agent workload through the server, prefix cache on against off: sessions
that share one system prompt each resend their whole history every turn
(chat/completions, streamed, session_id set), and time to first token is
taken per turn number at the client, with `--prompt-cache 0` as the cold
baseline in the same invocation.

usage: bench/agent_workload.py INFERD MODEL_DIR [--sessions 16] [--turns 8]
           [--system-tokens N] [--user-tokens 60-100] [--gen-tokens 32-64]
           [--device D] [--threads N] [--concurrency 4] [--seed 1]
           [--server-arg ARG]... [--only cached|cold] [--interleave] [--json FILE]

--system-tokens defaults to 600 where the server's context is 1,024 tokens
or less, else 2,000. When system + turns x (user + answer + the template's
tokens) would not fit the context, the user and answer ranges are scaled
down (and then the turns cut); what was used is printed. Prompt text is
pseudo-words from --seed, sized with `inferd tokenize MODEL_DIR --jsonl`.
Answers are greedy, of a fixed length drawn from --gen-tokens (the model's
end-of-sequence tokens are banned through logit_bias).
"""
import argparse
import http.client
import importlib.util
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tax", os.path.join(here, "serve_tax.py"))
serve_tax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_tax)

TARGET = 0.10  # cached TTFT over cold TTFT, turns >= 2


def int_range(text):
    lo, _, hi = text.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"not a range of positive integers: {text!r}")
    return lo, hi


# --- text ---------------------------------------------------------------

def tokenize(args, texts, special=False):
    """Token counts of each text, from the model's own tokenizer."""
    cmd = [args.inferd, "tokenize", args.model, "--jsonl"]
    if not special:
        cmd.append("--no-special")
    inp = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run(cmd, input=inp, check=True, capture_output=True, text=True).stdout
    counts = [len(json.loads(line)) for line in out.splitlines() if line.strip()]
    if len(counts) != len(texts):
        sys.exit(f"agent_workload: inferd tokenize gave {len(counts)} lines for {len(texts)} texts")
    return counts


def render(args, messages):
    """The chat template's text for a conversation, as the server renders it."""
    inp = json.dumps({"messages": messages, "add_generation_prompt": True}) + "\n"
    out = subprocess.run([args.inferd, "template", args.model], input=inp, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[0])["text"]


class Words:
    """Deterministic pseudo-words and what each costs in tokens after a space."""

    def __init__(self, args, rng, n=3000):
        cons = "bcdfghjklmnprstvwz"
        vows = "aeiou"
        seen = set()
        while len(seen) < n:
            w = "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(1, 3)))
            if rng.random() < 0.3:
                w += rng.choice(cons)
            seen.add(w)
        self.words = sorted(seen)
        counts = tokenize(args, [" " + w for w in self.words] + ["."])
        self.cost = dict(zip(self.words, counts))
        self.period = counts[-1]

    def text(self, rng, tokens):
        """About `tokens` tokens of sentences (pre-tokenizers split at spaces and
        punctuation, so the pieces' counts add up; the caller measures the whole)."""
        out, n, since = [], 0, 0
        while n < tokens:
            w = rng.choice(self.words)
            out.append(w)
            n += self.cost[w]
            since += 1
            if since >= rng.randint(6, 14) and n + self.period < tokens:
                out[-1] += "."
                n += self.period
                since = 0
        return " ".join(out).strip()


def sized_system_prompt(args, words, rng, target):
    """A system prompt measured at the target token count (± a word)."""
    text = words.text(rng, target)
    for _ in range(8):
        n = tokenize(args, [text])[0]
        if n == target:
            break
        parts = text.split(" ")
        if n > target and len(parts) > 1:
            text = " ".join(parts[:-1])
        elif n < target:
            text += " " + rng.choice(words.words)
        else:
            break
    return text, tokenize(args, [text])[0]


def template_overhead(args):
    """(tokens of the template around a system prompt and the first user turn
    and generation prompt, tokens each further user + assistant pair adds
    besides their contents)."""
    s, u, a = "sys", "question here", "answer there"
    cs, cu, ca = tokenize(args, [s, u, a])
    one = tokenize(args, [render(args, [{"role": "system", "content": s},
                                        {"role": "user", "content": u}])], special=True)[0]
    two = tokenize(args, [render(args, [{"role": "system", "content": s},
                                        {"role": "user", "content": u},
                                        {"role": "assistant", "content": a},
                                        {"role": "user", "content": u}])], special=True)[0]
    return one - cs - cu, two - one - cu - ca


def fit_plan(args, ctx, base, per_turn):
    """Scales the user/answer ranges (then the turns) so the last turn's
    prompt plus its answer fits the context; returns the plan and why."""
    (u0, u1), (g0, g1), turns = args.user_tokens, args.gen_tokens, args.turns
    slack = 1.1  # answers re-tokenized from text may take a few more tokens

    def need(u1_, g1_, t):
        return args.system_tokens + base + t * u1_ + math.ceil(t * g1_ * slack) + (t - 1) * per_turn

    if need(u1, g1, turns) < ctx:
        return (u0, u1), (g0, g1), turns, None
    avail = ctx - 1 - args.system_tokens - base
    note = (f"context {ctx}: system {args.system_tokens} + {turns} turns x "
            f"(user {u1} + answer {g1} + template {per_turn}) does not fit")
    while turns > 1:
        room = (avail - (turns - 1) * per_turn) / turns / slack
        scale = room / (u1 + g1)
        if scale * min(u0, g0) >= 4:
            su = (max(1, int(u0 * scale)), max(1, int(u1 * scale)))
            sg = (max(1, int(g0 * scale)), max(1, int(g1 * scale)))
            if need(su[1], sg[1], turns) < ctx:
                return su, sg, turns, note
        turns -= 1
    sys.exit(f"agent_workload: {note}, not even as one turn; lower --system-tokens")


# --- HTTP ---------------------------------------------------------------

def start_server(args, cache_on):
    # a cold prompt of thousands of tokens on a small CPU takes longer than the
    # default 30 s request timeout
    cmd = [args.inferd, "serve", args.model, "--port", "0", "--request-timeout", "3600",
           "--max-batch", str(max(args.concurrency, 1))]
    if not cache_on:
        cmd += ["--prompt-cache", "0"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.device:
        cmd += ["--device", args.device]
    for a in args.server_arg:
        cmd += a.split()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"http://([^:]+):(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        sys.exit(f"agent_workload: the server did not start: {' '.join(cmd)}")
    return proc, m.group(1), int(m.group(2)), cmd


def get_json(host, port, path):
    return json.loads(urllib.request.urlopen(f"http://{host}:{port}{path}").read().decode())


LATENCIES = ("time_to_first_token", "request_queue_time", "request_prefill_time")


def server_latencies(host, port):
    """{name: (sum, count)} of the server's own latency histograms: time to first token and
    its two parts, arrival to admission (queue) and admission to the first token (prefill)."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics").read().decode()
    out = {}
    for name in LATENCIES:
        total = float(re.search(rf"^inferd_{name}_seconds_sum (\S+)", text, re.M).group(1))
        count = int(re.search(rf"^inferd_{name}_seconds_count (\S+)", text, re.M).group(1))
        out[name] = (total, count)
    return out


def server_ttft(host, port):
    """(sum, count) of the server's own time-to-first-token histogram."""
    return server_latencies(host, port)["time_to_first_token"]


def stream_chat(host, port, body):
    """One streamed chat completion: time to the first chunk with text, the
    answer, and the usage the server reported."""
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection(host, port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", data, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        msg = resp.read().decode(errors="replace")
        conn.close()
        return {"error": f"{resp.status} {msg[:200]}"}
    ttft, text, usage = None, [], None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            d = c.get("delta", {})
            piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(d.get("content") or "")
    total = time.perf_counter() - t0
    conn.close()
    if usage is None:
        # the HTTP layer closes a connection that sends nothing for its idle
        # timeout (60 s), which a long enough prefill on a slow CPU reaches
        return {"error": f"the stream ended after {total:.1f} s without usage"
                         f"{'' if ttft is None else f' (first text at {ttft:.1f} s)'}"}
    return {"ttft": ttft if ttft is not None else total, "text": "".join(text),
            "prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"],
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


# --- the workload ---------------------------------------------------------

def run_workload(args, plan, labels):
    """Runs every session against one server per label ("cached", "cold");
    with more than one label each turn goes to each server in turn, so both
    see the same moments of a shared machine. Returns {label: (results,
    /stats prompt_cache, wall seconds, the engine's mean latencies {LATENCIES name:
    seconds})}."""
    servers = {}
    try:
        for label in labels:
            proc, host, port, cmd = start_server(args, label == "cached")
            servers[label] = (proc, host, port)
            print(f"[{label}] {' '.join(cmd)}", flush=True)
            stream_chat(host, port, {"messages": [{"role": "user", "content": "warm up"}],
                                     "max_tokens": 4, "temperature": 0})
        results = {label: {} for label in labels}
        lock = threading.Lock()  # the /metrics reads around a request need it alone

        def one(label, s, t, msgs):
            _, host, port = servers[label]
            body = {"messages": msgs, "max_tokens": plan["gen"][s][t], "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True},
                    "logit_bias": plan["bans"], "session_id": f"agent-{args.seed}-{s}"}
            if args.concurrency == 1:
                with lock:
                    s0 = server_ttft(host, port)[0]
                    r = stream_chat(host, port, body)
                    r["server_ttft"] = server_ttft(host, port)[0] - s0
            else:
                r = stream_chat(host, port, body)
            results[label][(s, t)] = r
            if "error" in r:
                print(f"[{label}] session {s} turn {t + 1}: {r['error']}", flush=True)
            return r

        def session(s):
            # each server keeps its own history: its own answers are resent
            msgs = {label: [{"role": "system", "content": plan["system"]}] for label in labels}
            live = list(labels)
            for t in range(plan["turns"]):
                for label in list(live):
                    msgs[label].append({"role": "user", "content": plan["user"][s][t]})
                    r = one(label, s, t, msgs[label])
                    if "error" in r:
                        live.remove(label)
                    else:
                        msgs[label].append({"role": "assistant", "content": r["text"]})

        m0 = {label: server_latencies(*servers[label][1:]) for label in labels}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(session, range(plan["sessions"])))
        wall = time.perf_counter() - t0
        out = {}
        for label in labels:
            host, port = servers[label][1:]
            m1 = server_latencies(host, port)
            engine = {name: (m1[name][0] - m0[label][name][0]) /
                      max(1, m1[name][1] - m0[label][name][1]) for name in LATENCIES}
            out[label] = (results[label], get_json(host, port, "/stats").get("prompt_cache"),
                          wall, engine)
        return out
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)


def p95(xs):
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


def machine_lines(args):
    """The ISA and the read bandwidth, as `inferd bench` measures them."""
    cmd = [args.inferd, "bench", args.model, "--prompt-len", "16", "--gen-len", "8", "--reps", "1"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.device:
        cmd += ["--device", args.device]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    except (subprocess.SubprocessError, OSError):
        return ["machine: inferd bench did not run"]
    return [l for l in out.splitlines() if re.match(r"(cpu|cuda|device|gpu|read bandwidth)\b", l)]


def report(args, plan, runs):
    turns = plan["turns"]
    have_server = args.concurrency == 1
    print()
    hdr = (f"{'turn':>4} {'prompt':>7} {'cached/prompt':>13} {'computed':>8} | {'cached TTFT ms':>17} | "
           f"{'cold TTFT ms':>17} | {'ratio':>6}")
    if have_server:
        hdr += f" | {'server TTFT ms cached/cold':>26}"
    print(hdr)
    print(f"{'':>4} {'tokens':>7} {'(cache on)':>13} {'tokens':>8} | {'mean':>8} {'p95':>8} | "
          f"{'mean':>8} {'p95':>8} |")
    ratios = {}
    late = {"cached": [], "cold": []}
    for t in range(turns):
        row = {}
        for label in ("cached", "cold"):
            res = runs.get(label)
            if not res:
                continue
            rs = [r for (s, tt), r in res[0].items() if tt == t and "error" not in r]
            if rs:
                row[label] = rs
                if t >= 1:
                    late[label] += [r["ttft"] for r in rs]
        if not row:
            continue
        any_rs = row.get("cached") or row.get("cold")
        prompt = statistics.mean(r["prompt"] for r in any_rs)
        frac = (statistics.mean(r["cached"] / r["prompt"] for r in row["cached"])
                if "cached" in row else float("nan"))
        computed = (statistics.mean(r["prompt"] - r["cached"] for r in row["cached"])
                    if "cached" in row else float("nan"))
        cells = []
        for label in ("cached", "cold"):
            if label in row:
                xs = [r["ttft"] * 1e3 for r in row[label]]
                cells.append(f"{statistics.mean(xs):8.1f} {p95(xs):8.1f}")
            else:
                cells.append(f"{'-':>8} {'-':>8}")
        ratio = ""
        if "cached" in row and "cold" in row:
            ratios[t + 1] = (statistics.mean(r["ttft"] for r in row["cached"])
                             / statistics.mean(r["ttft"] for r in row["cold"]))
            ratio = f"{ratios[t + 1]:6.3f}"
        line = f"{t + 1:>4} {prompt:7.0f} {frac:13.3f} {computed:8.1f} | {cells[0]} | {cells[1]} | {ratio:>6}"
        if have_server:
            sv = []
            for label in ("cached", "cold"):
                xs = [r["server_ttft"] * 1e3 for r in row.get(label, []) if "server_ttft" in r]
                sv.append(f"{statistics.mean(xs):.1f}" if xs else "-")
            line += f" | {' / '.join(sv):>26}"
        print(line)
    print()
    if late["cached"] and late["cold"]:
        pooled = statistics.mean(late["cached"]) / statistics.mean(late["cold"])
        worst = max(v for k, v in ratios.items() if k >= 2)
        met = worst <= TARGET
        print(f"turns >= 2: cached TTFT {statistics.mean(late['cached']) * 1e3:.1f} ms mean, "
              f"cold {statistics.mean(late['cold']) * 1e3:.1f} ms; cached / cold {pooled:.3f} "
              f"pooled, {worst:.3f} at the worst turn — target <= {TARGET:.2f}: "
              f"{'met' if met else 'MISSED'}")
    for label in ("cached", "cold"):
        if label in runs:
            res, pc, wall, engine = runs[label]
            bad = sum(1 for (s, t), r in res.items()
                      if "error" in r or r["completion"] != plan["gen"][s][t])
            client = statistics.mean(r["ttft"] for r in res.values() if "error" not in r)
            print(f"{label}: {len(res)} requests in {wall:.1f} s, {bad} failed or of another "
                  f"length than asked; TTFT over all turns {client * 1e3:.1f} ms at the client, "
                  f"{engine['time_to_first_token'] * 1e3:.1f} ms in the engine (/metrics: "
                  f"arrival to first token; {engine['request_queue_time'] * 1e3:.1f} ms to "
                  f"admission, {engine['request_prefill_time'] * 1e3:.1f} ms from it)")
            print(f"/stats prompt_cache ({label}, at the end): {json.dumps(pc)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=0)
    p.add_argument("--user-tokens", type=int_range, default=(60, 100))
    p.add_argument("--gen-tokens", type=int_range, default=(32, 64))
    p.add_argument("--device", default="")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--server-arg", action="append", default=[],
                   help="more `inferd serve` flags, e.g. '--mode exact' (repeatable)")
    p.add_argument("--only", choices=("cached", "cold"), default=None,
                   help="run one of the two servers only")
    p.add_argument("--interleave", action="store_true",
                   help="both servers at once, each turn sent to one then the other (for a "
                        "noisy machine; best with --concurrency 1)")
    p.add_argument("--json", default="",
                   help="write every request's numbers (session, turn, asked length) here")
    args = p.parse_args()
    if args.sessions < 1 or args.turns < 1 or args.concurrency < 1:
        sys.exit("agent_workload: --sessions, --turns and --concurrency must be positive")

    # the context the server will use, from a server started with the same flags
    proc, host, port, _ = start_server(args, True)
    try:
        ctx = get_json(host, port, "/stats")["engine"]["context"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if not args.system_tokens:
        args.system_tokens = 600 if ctx <= 1024 else 2000

    rng = random.Random(args.seed)
    words = Words(args, rng)
    system, sys_n = sized_system_prompt(args, words, rng, args.system_tokens)
    base, per_turn = template_overhead(args)
    (u0, u1), (g0, g1), turns, note = fit_plan(args, ctx, base, per_turn)
    user = [[words.text(rng, rng.randint(u0, u1)) for _ in range(turns)]
            for _ in range(args.sessions)]
    gen = [[rng.randint(g0, g1) for _ in range(turns)] for _ in range(args.sessions)]
    user_n = tokenize(args, [u for row in user for u in row])
    plan = {"system": system, "user": user, "gen": gen, "turns": turns,
            "sessions": args.sessions,
            "bans": {str(i): -100 for i in serve_tax.eos_ids(args.model)}}

    print(f"model {args.model}, context {ctx}{', device ' + args.device if args.device else ''}")
    for line in machine_lines(args):
        print(line)
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.1f}")
    if note:
        print(f"fit: {note}; scaled to user {u0}-{u1}, answer {g0}-{g1}, {turns} turns")
    print(f"workload: {args.sessions} sessions x {turns} turns, {args.concurrency} at a time, "
          f"seed {args.seed}; system prompt {sys_n} tokens; user messages "
          f"{min(user_n)}-{max(user_n)} tokens (mean {statistics.mean(user_n):.1f}); answers "
          f"{g0}-{g1} tokens (greedy, end-of-sequence banned); template adds {base} + "
          f"{per_turn} a turn", flush=True)

    labels = [l for l in ("cached", "cold") if args.only in (None, l)]
    if args.interleave:
        print("interleaved: both servers up, each turn sent to the cached one, then the cold one")
        runs = run_workload(args, plan, labels)
    else:
        runs = {}
        for label in labels:
            runs.update(run_workload(args, plan, [label]))
    report(args, plan, runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({label: [dict(r, session=s, turn=t + 1, max_tokens=plan["gen"][s][t],
                                    text=None)
                               for (s, t), r in sorted(res[0].items())]
                       for label, res in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
