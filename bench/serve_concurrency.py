#!/usr/bin/env python3
"""Continuous batching through the server: N concurrent streamed completions
(random token-id prompts, greedy, end-of-sequence tokens banned so each
generates the full length), for each N: all tokens over the round's wall time
(prefill included), aggregate decode (the tokens of all streams that arrive
while every stream is decoding, from the last stream's first token to the
first stream's last, over that time) and its ratio to one stream's, and the
mean decode rate one stream sees ((tokens - 1) over its first to last token).
The stream counts take turns for --rounds rounds (default 3), each a fresh set of
prompts, and the medians are compared: the machine's speed drifts between runs.

The streams come from build/sse_streams (beside INFERD): one thread polling every
connection, each text chunk timed without decoding its JSON, so the client takes
well under 1% of the CPU time. --client python runs a Python thread per stream
instead (each chunk's JSON decoded), which on a machine of two cores takes about
a tenth of what the server has to decode with.

usage: bench/serve_concurrency.py INFERD MODEL_DIR [--streams 1,2,4,8,16]
                                  [--prompt-len 32] [--gen-len 64] [--device D]
                                  [--threads N] [--server-log FILE] [--client c|python]
                                  [--rounds 3]
"""
import argparse
import importlib.util
import json
import os
import random
import re
import statistics
import subprocess
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tax", os.path.join(here, "serve_tax.py"))
serve_tax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_tax)


def c_streams(streamer, host, port, prompts, gen_len, bans):
    """Every prompt streamed at once by sse_streams; (results, arrivals) as python_streams."""
    bodies = "".join(json.dumps(serve_tax.completion_body(pr, gen_len, bans)) + "\n"
                     for pr in prompts)
    out = subprocess.run([streamer, host, str(port), "/v1/completions"], input=bodies,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"serve_concurrency: {out.stderr.strip()}")
    results, arrivals = [], []
    for line in out.stdout.splitlines():
        f = line.split()
        tokens, sent, times = int(f[1]), float(f[2]), [float(x) for x in f[3:]]
        n = tokens if tokens >= 0 else len(times)
        if len(times) < 2:
            results.append((None, None, n))
        else:
            results.append((times[0] - sent, (n - 1) / (times[-1] - times[0]), n))
        arrivals.append(times)
    return results, arrivals


def python_streams(host, port, prompts, gen_len, bans):
    """A thread per prompt through serve_tax.stream_once: ([(ttft, decode, tokens)],
    [each stream's text chunk arrival times]), paired by index."""
    results, arrivals = [], []
    lock = threading.Lock()

    def one(prompt):
        times = []
        r = serve_tax.stream_once(host, port, prompt, gen_len, bans, times)
        with lock:  # the two lists pair up by index
            results.append(r)
            arrivals.append(times)

    threads = [threading.Thread(target=one, args=(pr,)) for pr in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, arrivals


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
    p.add_argument("--rounds", type=int, default=3,
                   help="each stream count this many times, the counts taking turns (the "
                        "machine's speed drifts between runs); medians reported")
    p.add_argument("--client", choices=("c", "python"), default="c",
                   help="c: build/sse_streams polls every stream from one thread (default); "
                        "python: a thread per stream")
    args = p.parse_args()
    streamer = os.path.join(os.path.dirname(os.path.abspath(args.inferd)), "sse_streams")
    if args.client == "c" and not os.access(streamer, os.X_OK):
        raise SystemExit(f"serve_concurrency: {streamer} is not built (make build), "
                         "or run with --client python")
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
          f"{', serve ' + ' '.join(args.server_arg) if args.server_arg else ''}"
          f", client {args.client}", flush=True)
    aggregate = {n: [] for n in counts}
    try:
        serve_tax.stream_once(host, port, [1, 2, 3], 4, bans)  # warm-up
        for rnd, n in ((r, n) for r in range(args.rounds) for n in counts):
            results = []
            arrivals = []
            prompts = [[rng.randrange(0, 8000) for _ in range(args.prompt_len)] for _ in range(n)]

            t0 = time.perf_counter()
            if args.client == "c":
                results, arrivals = c_streams(streamer, host, port, prompts, args.gen_len, bans)
            else:
                results, arrivals = python_streams(host, port, prompts, args.gen_len, bans)
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
            aggregate[n].append(decode)
            one_stream = aggregate[1][rnd] if 1 in aggregate and len(aggregate[1]) > rnd else None
            ratio = f", {decode / one_stream:5.2f}x one stream" if one_stream else ""
            load = os.getloadavg()[0]
            print(f"{n:3d} streams: {tokens / elapsed:9.1f} tok/s aggregate (wall, incl. prefill), "
                  f"{decode:9.1f} tok/s aggregate decode{ratio}, "
                  f"{sum(rates) / n:8.1f} tok/s per stream decode (load average {load:.1f})",
                  flush=True)
        if args.rounds > 1:
            medians = {n: statistics.median(v) for n, v in aggregate.items()}
            print("medians of %d rounds: %s" % (args.rounds, ", ".join(
                f"{n} streams {medians[n]:.1f} tok/s" +
                (f" ({medians[n] / medians[1]:.2f}x)" if 1 in medians else "") for n in counts)))
        if 1 in aggregate and 8 in aggregate and not args.device.startswith("cuda"):
            r = statistics.median(aggregate[8]) / statistics.median(aggregate[1])
            print(f"8 streams' aggregate decode / one stream's: {r:.2f}x "
                  f"(target >= 3x for the house model on the CPU: {'met' if r >= 3 else 'MISSED'})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
