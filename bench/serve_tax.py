#!/usr/bin/env python3
"""Server tax: decode speed and time to first token through HTTP + SSE, against
`inferd bench` on the same model, prompt length and generation length, measured
in the same run (alternating, so both see the same machine).

usage: bench/serve_tax.py INFERD MODEL_DIR [--prompt-len 128] [--gen-len 64]
                          [--reps 3] [--threads N] [--device cpu|cuda[:N]]
"""
import argparse
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def engine_bench(args):
    cmd = [args.inferd, "bench", args.model, "--prompt-len", str(args.prompt_len),
           "--gen-len", str(args.gen_len), "--reps", "3"]  # the median leaves out first-use costs
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.device:
        cmd += ["--device", args.device]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    prefill = float(re.search(r"^prefill\s+\d+ tokens.*?: ([\d.]+) tok/s", out, re.M).group(1))
    decode = float(re.search(r"^decode\s+\d+ tokens: ([\d.]+) tok/s", out, re.M).group(1))
    return prefill, decode


def start_server(args):
    cmd = [args.inferd, "serve", args.model, "--port", "0", "--max-batch", "1"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://([^:]+):(\d+)", line)
    if not m:
        proc.kill()
        sys.exit(f"serve_tax: the server did not start: {line!r}")
    return proc, m.group(1), int(m.group(2))


def eos_ids(model):
    ids = set()
    for name in ("config.json", "generation_config.json"):
        try:
            with open(f"{model}/{name}") as f:
                v = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, list):
            ids.update(x for x in v if isinstance(x, int))
    # the tokenizer's own end-of-sequence token, which the server also stops on
    try:
        with open(f"{model}/tokenizer_config.json") as f:
            eos = json.load(f).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        with open(f"{model}/tokenizer.json") as f:
            for t in json.load(f).get("added_tokens", []):
                if t.get("content") == eos:
                    ids.add(t["id"])
    except (OSError, ValueError):
        pass
    return ids


def completion_body(prompt, gen_len, bans):
    """A streamed greedy completion of gen_len tokens with the bans' logits at -100."""
    return {
        "prompt": prompt, "max_tokens": gen_len, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {str(i): -100 for i in bans},
    }


def stream_once(host, port, prompt, gen_len, bans, times=None):
    """One streamed completion; returns (ttft_s, decode_tok_s, tokens). The
    arrival time of each text chunk is appended to `times` when given."""
    body = json.dumps(completion_body(prompt, gen_len, bans)).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    s.sendall(req)
    buf = b""
    token_times = []
    usage = None
    while True:
        data = s.recv(65536)
        now = time.perf_counter()
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                # chunked transfer framing lines are skipped; only SSE data lines count
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk.get("choices", []):
                    if c.get("text"):
                        token_times.append(now)
    s.close()
    if times is not None:
        times.extend(token_times)
    # Text chunks: one per token except where a token ends inside a UTF-8
    # character (its text comes with the next), so the count comes from usage.
    n = usage["completion_tokens"] if usage else len(token_times)
    if len(token_times) < 2:  # e.g. a random model whose picks are special tokens with no text
        return None, None, n
    ttft = token_times[0] - t0
    decode = (n - 1) / (token_times[-1] - token_times[0])
    return ttft, decode, n


def engine_ttft(host, port):
    """(sum, count) of the server's own time-to-first-token histogram."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics").read().decode()
    total = float(re.search(r"^inferd_time_to_first_token_seconds_sum (\S+)", text, re.M).group(1))
    count = int(re.search(r"^inferd_time_to_first_token_seconds_count (\S+)", text, re.M).group(1))
    return total, count


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="")
    args = p.parse_args()

    with open(f"{args.model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(1)
    bans = eos_ids(args.model)
    proc, host, port = start_server(args)
    try:
        stream_once(host, port, [1, 2, 3], 4, bans)  # warm-up
        rows = []
        for _ in range(args.reps):
            prompt = [rng.randrange(0, min(vocab, 30000)) for _ in range(args.prompt_len)]
            s0, c0 = engine_ttft(host, port)
            ttft, dec, n = stream_once(host, port, prompt, args.gen_len, bans)
            s1, c1 = engine_ttft(host, port)
            if ttft is None:
                sys.exit(f"serve_tax: {n} tokens generated but fewer than 2 streamed text; "
                         "no timing can be taken from this model and prompt")
            inner_ttft = (s1 - s0) / (c1 - c0)
            proc.send_signal(19)  # SIGSTOP: the engine bench gets the cores to itself
            try:
                pre_tps, dec_tps = engine_bench(args)
            finally:
                proc.send_signal(18)  # SIGCONT
            rows.append((ttft, dec, n, args.prompt_len / pre_tps, dec_tps, inner_ttft))
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    ttft = statistics.median(r[0] for r in rows)
    dec = statistics.median(r[1] for r in rows)
    prefill_s = statistics.median(r[3] for r in rows)
    dec_engine = statistics.median(r[4] for r in rows)
    http_ttft = statistics.median(r[0] - r[5] for r in rows)
    print(f"model           {args.model}, prompt {args.prompt_len}, generate {args.gen_len}, "
          f"{args.reps} repetitions (medians)")
    print(f"engine (bench)  prefill {prefill_s * 1e3:.2f} ms, decode {dec_engine:.2f} tok/s")
    print(f"server (SSE)    time to first token {ttft * 1e3:.2f} ms, decode {dec:.2f} tok/s "
          f"({rows[-1][2]} tokens)")
    print(f"server tax      decode {100 * (dec_engine - dec) / dec_engine:+.1f}% slower; "
          f"first token +{(ttft - prefill_s) * 1e3:.2f} ms over the engine's prefill, of which "
          f"HTTP + SSE (client's first token minus the engine's own, from /metrics) "
          f"{http_ttft * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
