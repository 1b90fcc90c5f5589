#!/usr/bin/env python3
"""Continuous batching through the server: N concurrent streamed completions
(random token-id prompts, greedy, end-of-sequence tokens banned so each
generates the full length), aggregate and per-stream decode rate for each N.

usage: bench/serve_concurrency.py INFERD MODEL_DIR [--streams 1,2,4,8,16]
                                  [--prompt-len 32] [--gen-len 64] [--device D]
"""
import argparse
import importlib.util
import os
import random
import re
import subprocess
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tax", os.path.join(here, "serve_tax.py"))
serve_tax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_tax)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--streams", default="1,2,4,8,16")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--device", default="")
    args = p.parse_args()
    counts = [int(n) for n in args.streams.split(",")]

    cmd = [args.inferd, "serve", args.model, "--port", "0", "--max-batch", str(max(counts))]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"http://([^:]+):(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("serve_concurrency: the server did not start")
    host, port = m.group(1), int(m.group(2))
    bans = serve_tax.eos_ids(args.model)
    rng = random.Random(1)
    print(f"model {args.model}, prompt {args.prompt_len}, generate {args.gen_len}"
          f"{', device ' + args.device if args.device else ''}")
    try:
        serve_tax.stream_once(host, port, [1, 2, 3], 4, bans)  # warm-up
        for n in counts:
            results = []
            prompts = [[rng.randrange(0, 8000) for _ in range(args.prompt_len)] for _ in range(n)]

            def one(prompt):
                results.append(serve_tax.stream_once(host, port, prompt, args.gen_len, bans))

            threads = [threading.Thread(target=one, args=(pr,)) for pr in prompts]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            tokens = sum(r[2] for r in results)
            per_stream = sum(r[1] for r in results) / n
            print(f"{n:3d} streams: {tokens / elapsed:9.1f} tok/s aggregate (wall, incl. prefill), "
                  f"{per_stream:8.1f} tok/s per stream decode")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
