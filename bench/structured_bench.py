#!/usr/bin/env python3
"""Structured output's cost through the server, batch 1: decode tok/s of a reply constrained by a
JSON schema against the same prompt unconstrained (interleaved, one server), the forward passes
per output token (jump-forward appends forced keys and punctuation without sampling them), and
the engine's per-token mask time (/stats.structured_output).

usage: bench/structured_bench.py INFERD MODEL_DIR [--device cuda] [--rounds 5] [--prompt-len 64]
                                 [--server-arg '--threads 2']...
Target: constrained decode >= 95% of unconstrained tok/s.
"""
import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import serve_tax  # noqa: E402  (eos ids of a model directory)

# Long fixed keys (forced bytes: jump-forward's case) and bounded values, so every reply ends.
SCHEMA = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 999999},
        "shipping_address_first_line": {"type": "string", "maxLength": 24},
        "preferred_delivery_window": {"enum": ["morning", "afternoon", "evening"]},
        "items_in_the_order": {"type": "array", "maxItems": 4,
                               "items": {"type": "string", "maxLength": 12}},
        "gift_wrapping_requested": {"type": "boolean"},
    },
    "required": ["customer_identification_number", "shipping_address_first_line",
                 "preferred_delivery_window", "items_in_the_order", "gift_wrapping_requested"],
    "additionalProperties": False,
}


def stream(host, port, body):
    """One streamed completion: (decode tok/s from the first to the last token, tokens)."""
    data = json.dumps(body).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(req)
    buf, times, usage = b"", [], None
    while True:
        chunk = s.recv(65536)
        now = time.perf_counter()
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                c = json.loads(line[6:])
                if c.get("usage"):
                    usage = c["usage"]
                if any(x.get("text") for x in c.get("choices", [])):
                    times.append(now)
    s.close()
    n = usage["completion_tokens"] if usage else len(times)
    span = times[-1] - times[0] if len(times) > 1 else 0
    return ((n - 1) / span if span > 0 else 0.0), n


def stats(url):
    return json.loads(urllib.request.urlopen(f"{url}/stats").read())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--device", default="")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--server-arg", action="append", default=[])
    a = p.parse_args()
    cmd = [a.inferd, "serve", a.model, "--port", "0", "--max-batch", "1"]
    if a.device:
        cmd += ["--device", a.device]
    for s in a.server_arg:
        cmd += s.split()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"http://([^:]+):(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("structured_bench: the server did not start")
    host, port = m.group(1), int(m.group(2))
    url = f"http://{host}:{port}"
    bans = serve_tax.eos_ids(a.model)
    rng = random.Random(1)
    print(f"model {a.model}{', device ' + a.device if a.device else ''}; prompt {a.prompt_len} "
          f"random ids, greedy, batch 1; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.1f}")
    free, bound = [], []
    try:
        for r in range(a.rounds):
            prompt = [rng.randrange(100, 8000) for _ in range(a.prompt_len)]
            s0 = stats(url)
            rate_c, n_c = stream(host, port, {
                "prompt": prompt, "max_tokens": 256, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "order", "schema": SCHEMA}}})
            s1 = stats(url)
            # unconstrained: as many tokens, end-of-sequence banned
            rate_f, n_f = stream(host, port, {
                "prompt": prompt, "max_tokens": n_c, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
                "logit_bias": {str(i): -100 for i in bans}})
            steps = s1["engine"].get("steps", 0) - s0["engine"].get("steps", 0) \
                if "steps" in s1.get("engine", {}) else None
            forced = s1["structured_output"]["forced_tokens"] - s0["structured_output"]["forced_tokens"]
            print(f"round {r + 1}: constrained {rate_c:8.2f} tok/s ({n_c} tokens, {forced} appended "
                  f"by jump-forward{', ' + str(steps) + ' steps' if steps is not None else ''}); "
                  f"unconstrained {rate_f:8.2f} tok/s ({n_f} tokens)")
            bound.append((rate_c, n_c, forced))
            free.append(rate_f)
        so = stats(url)["structured_output"]
    finally:
        proc.terminate()
        proc.wait()
    mc = sum(b[0] for b in bound) / len(bound)
    mf = sum(free) / len(free)
    toks = sum(b[1] for b in bound)
    forced = sum(b[2] for b in bound)
    print(f"mean decode: constrained {mc:.2f} tok/s, unconstrained {mf:.2f} tok/s: "
          f"{100 * mc / mf:.1f}% (target >= 95%)")
    print(f"jump-forward: {forced} of {toks} output tokens appended without a pick "
          f"(sampled picks / output tokens {1 - forced / toks:.2f})")
    print(f"per-token mask in the engine: median {so['mask_us_p50']:.1f} us, p99 "
          f"{so['mask_us_p99']:.1f} us over {so['masks']} masks")


if __name__ == "__main__":
    main()
