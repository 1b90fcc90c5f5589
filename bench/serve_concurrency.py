#!/usr/bin/env python3
"""Continuous batching through the server: N concurrent streamed completions
(random token-id prompts, greedy, end-of-sequence tokens banned so each
generates the full length), for each N: all tokens over the round's wall time
(prefill included), aggregate decode (the tokens of all streams that arrive
while every stream is decoding, from the last stream's first token to the
first stream's last, over that time) and its ratio to one stream's, and the
mean decode rate one stream sees ((tokens - 1) over its first to last token).

usage: bench/serve_concurrency.py INFERD MODEL_DIR [--streams 1,2,4,8,16]
                                  [--prompt-len 32] [--gen-len 64] [--device D]
                                  [--threads N] [--server-log FILE]
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
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--server-arg", action="append", default=[],
                   help="more `inferd serve` flags, e.g. '--cuda-gemv-rows 4' (repeatable)")
    p.add_argument("--server-log", default="",
                   help="the server's standard error goes to FILE (e.g. with INFERD_CUDA_PROFILE set)")
    args = p.parse_args()
    counts = [int(n) for n in args.streams.split(",")]

    cmd = [args.inferd, "serve", args.model, "--port", "0", "--max-batch", str(max(counts))]
    if args.device:
        cmd += ["--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    for a in args.server_arg:
        cmd += a.split()
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    m = re.search(r"http://([^:]+):(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("serve_concurrency: the server did not start")
    host, port = m.group(1), int(m.group(2))
    # the server keeps writing to stdout: drain it, or a full pipe stalls the server
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    bans = serve_tax.eos_ids(args.model)
    rng = random.Random(1)
    print(f"model {args.model}, prompt {args.prompt_len}, generate {args.gen_len}"
          f"{', device ' + args.device if args.device else ''}"
          f"{', serve ' + ' '.join(args.server_arg) if args.server_arg else ''}", flush=True)
    one_stream = None
    aggregate = {}
    try:
        serve_tax.stream_once(host, port, [1, 2, 3], 4, bans)  # warm-up
        for n in counts:
            results = []
            arrivals = []
            prompts = [[rng.randrange(0, 8000) for _ in range(args.prompt_len)] for _ in range(n)]

            def one(prompt):
                times = []
                r = serve_tax.stream_once(host, port, prompt, args.gen_len, bans, times)
                with lock:  # the two lists pair up by index
                    results.append(r)
                    arrivals.append(times)

            lock = threading.Lock()
            threads = [threading.Thread(target=one, args=(pr,)) for pr in prompts]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            tokens = sum(r[2] for r in results)
            rates = [r[1] for r in results if r[1] is not None]
            if len(rates) < n:
                raise SystemExit(f"serve_concurrency: {n - len(rates)} of {n} streams sent fewer "
                                 "than 2 text chunks; no decode rate can be taken")
            w0 = max(t[0] for t in arrivals)
            w1 = min(t[-1] for t in arrivals)
            # a chunk can carry two tokens (one that ends inside a UTF-8 character
            # comes with the next), so each stream's chunks count at its tokens per chunk
            inside = sum(sum(1 for x in ts if w0 < x <= w1) * (r[2] - 1) / (len(ts) - 1)
                         for ts, r in zip(arrivals, results))
            if w1 - w0 < 0.2 * elapsed:
                raise SystemExit(f"serve_concurrency: at {n} streams all decode together for "
                                 f"{w1 - w0:.3f} of {elapsed:.3f} s; raise --gen-len")
            decode = inside / (w1 - w0)
            aggregate[n] = decode
            if n == 1:
                one_stream = decode
            ratio = f", {decode / one_stream:5.2f}x one stream" if one_stream else ""
            load = os.getloadavg()[0]
            print(f"{n:3d} streams: {tokens / elapsed:9.1f} tok/s aggregate (wall, incl. prefill), "
                  f"{decode:9.1f} tok/s aggregate decode{ratio}, "
                  f"{sum(rates) / n:8.1f} tok/s per stream decode (load average {load:.1f})",
                  flush=True)
        if 1 in aggregate and 8 in aggregate and not args.device.startswith("cuda"):
            r = aggregate[8] / aggregate[1]
            print(f"8 streams' aggregate decode / one stream's: {r:.2f}x "
                  f"(target >= 3x for the house model on the CPU: {'met' if r >= 3 else 'MISSED'})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
