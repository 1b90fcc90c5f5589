#!/usr/bin/env python3
"""Prefix-cache hits against cold runs through the server, on any device: the
same completions (token-id prompts sharing prefixes of every length: whole
blocks, partial blocks, a whole earlier prompt) sent to a server with the cache
and to one with `--prompt-cache 0`, greedy and seeded; the generated tokens and
their logprobs are compared. In exact mode every pair must be identical (exit 1
otherwise); in fast mode the agreement is reported.

usage: bench/cache_check.py INFERD MODEL_DIR [--device D] [--mode exact|fast]
                            [--prompts 24] [--gen-len 16]
"""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tax", os.path.join(here, "serve_tax.py"))
serve_tax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_tax)


def start(args, extra):
    cmd = [args.inferd, "serve", args.model, "--port", "0", "--mode", args.mode, "--max-batch", "8"]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.Popen(cmd + extra, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(r"(http://\S+)", line)
    if not m:
        proc.kill()
        sys.exit(f"cache_check: the server did not start: {line!r}")
    return proc, m.group(1)


def complete(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=600).read().decode())
    c = r["choices"][0]
    return {"text": c["text"], "tokens": c["logprobs"]["tokens"],
            "logprobs": c["logprobs"]["token_logprobs"],
            "cached": r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--device")
    p.add_argument("--mode", default="exact", choices=["exact", "fast"])
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--gen-len", type=int, default=16)
    args = p.parse_args()
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    rng = random.Random(7)
    shared = [rng.randrange(vocab) for _ in range(300)]
    # Prefix lengths: inside the first block, whole blocks, partial blocks, long.
    cuts = [1, 5, 16, 17, 31, 32, 48, 63, 100, 128, 129, 200, 255, 256, 299]
    bans = {str(t): -100 for t in serve_tax.eos_ids(args.model)}
    bodies = []
    for i in range(args.prompts):
        cut = cuts[i % len(cuts)]
        prompt = shared[:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        body = {"prompt": prompt, "max_tokens": args.gen_len, "logprobs": 1, "logit_bias": bans}
        if i % 2:
            body.update(temperature=0.9, seed=1000 + i)
        else:
            body.update(temperature=0)
        bodies.append(body)
    # A prompt sent again whole, and one that extends an earlier prompt.
    bodies.append(dict(bodies[3]))
    bodies.append(dict(bodies[8], prompt=bodies[8]["prompt"] + [rng.randrange(vocab) for _ in range(20)]))

    cached_proc, cached_url = start(args, [])
    cold_proc, cold_url = start(args, ["--prompt-cache", "0"])
    try:
        cold = [complete(cold_url, b) for b in bodies]
        complete(cached_url, {"prompt": shared, "max_tokens": 1, "logprobs": 1})  # the shared prefix, cached
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # hits under concurrency
            hot = list(pool.map(lambda b: complete(cached_url, b), bodies))
        again = [complete(cached_url, b) for b in bodies]  # every prompt now cached whole
    finally:
        for proc in (cached_proc, cold_proc):
            proc.terminate()
            proc.wait()
    same_tokens = same_bits = 0
    rows = len(bodies) * 2
    for c, h, a in zip(cold, hot, again):
        for x in (h, a):
            same_tokens += x["tokens"] == c["tokens"]
            same_bits += x["tokens"] == c["tokens"] and x["logprobs"] == c["logprobs"]
    reused = sum(x["cached"] for x in hot + again)
    print(f"cache_check: {args.mode} mode, device {args.device or 'cpu'}: {rows} cached runs "
          f"against cold ones; identical tokens {same_tokens}/{rows}, identical tokens and "
          f"logprobs {same_bits}/{rows}; {reused} prompt tokens reused")
    if args.mode == "exact" and same_bits != rows:
        for i, (c, h, a) in enumerate(zip(cold, hot, again)):
            if h["tokens"] != c["tokens"] or a["tokens"] != c["tokens"]:
                print(f"  prompt {i} (cached {h['cached']}/{a['cached']}): cold {c['text']!r} "
                      f"hot {h['text']!r} again {a['text']!r}")
        sys.exit(1)


if __name__ == "__main__":
    main()
