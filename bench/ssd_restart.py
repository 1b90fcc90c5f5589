#!/usr/bin/env python3
"""The SSD tier through the server, two measurements.

restart: time to first token of a long prefix (random token ids, /v1/completions,
max_tokens 1, greedy) on a server with --ssd-cache over a fresh directory (a
cold prefill), then POST /admin/cache/flush, SIGTERM, a new server on the same
directory, the page cache dropped (echo 3 > /proc/sys/vm/drop_caches; the
script says whether that worked), the same prompt again (restored from disk
when the cost model says so); then once more after another restart without
dropping the page cache (warm). Each row gives the client's TTFT, the engine's
(inferd_time_to_first_token_seconds), cached_tokens and the cost model's
decision and predictions from /stats. With --cold-off, a server with
--prompt-cache 0 also prefills the prompt (cold without the tier).

decode: streamed decode tok/s while write-behind runs at full rate against the
tier off, every server up, rounds interleaved (each round visits every server,
the order rotated and reversed from round to round): each visit sends a fresh
prompt of --prompt-len random ids (its blocks are queued for writing as its
prefill publishes them, so the I/O thread writes while the stream decodes) and
measures one stream's decode from its first to its last token
(bench/serve_tax.py's stream_once); a tier-on server's writes are drained
before the next visit, so they never run beside another server's stream.
--direct-io MODE (repeatable) starts one tier-on server per --ssd-direct-io
mode; the report gives every round, the mean and median of each server, and
the median of the rounds' on/off ratios, with the tier's counters (direct_io,
blocks written, write calls, writes from where the data lies, the I/O thread's
CPU time); with --watch-writes also how much of each decode the writes overlapped
(a tier-on server's /stats polled every 50 ms during its stream until its writes
are drained: a cost the tier-off server does not pay, so leave it off where the
writes last the whole decode).

usage: bench/ssd_restart.py restart INFERD MODEL_DIR [--prompt-len 8000] [--dir DIR]
                                    [--cold-off] [--server-arg '--threads 2']...
       bench/ssd_restart.py decode INFERD MODEL_DIR [--prompt-len 512] [--gen-len 64]
                                    [--rounds 8] [--threads N] [--direct-io auto|on|off]...
                                    [--watch-writes] [--off-first | --both-orders]
                                    [--server-arg ...]...
"""
import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("serve_tax", os.path.join(here, "serve_tax.py"))
serve_tax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_tax)


class Server:
    def __init__(self, inferd, model, flags, log):
        self.log = log
        cmd = [inferd, "serve", model, "--port", "0"] + flags
        self.err = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([^:]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise SystemExit(f"ssd_restart: the server did not start: {open(log).read()[-2000:]}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.url = f"http://{self.host}:{self.port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read().decode()

    def post(self, path, body, timeout=3600):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def engine_ttft(self):
        """Sum and count of the engine's TTFT histogram."""
        text = self.get("/metrics")
        s = float(re.search(r"^inferd_time_to_first_token_seconds_sum (\S+)", text, re.M).group(1))
        n = int(re.search(r"^inferd_time_to_first_token_seconds_count (\S+)", text, re.M).group(1))
        return s, n

    def stop(self):
        self.proc.terminate()
        code = self.proc.wait(timeout=600)
        self.err.close()
        return code


def first_token(server, prompt):
    """Client TTFT (a non-streamed request for one token), engine TTFT, cached tokens."""
    s0, n0 = server.engine_ttft()
    t0 = time.perf_counter()
    status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    client = time.perf_counter() - t0
    if status != 200:
        raise SystemExit(f"ssd_restart: HTTP {status}: {body}")
    s1, n1 = server.engine_ttft()
    engine = (s1 - s0) / (n1 - n0) if n1 > n0 else float("nan")
    cached = (body.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return client, engine, cached


def drop_page_cache():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped (echo 3 > /proc/sys/vm/drop_caches)"
    except OSError as e:
        return f"NOT dropped ({e.strerror}): the restore below may read from memory"


def tier_line(server):
    st = json.loads(server.get("/stats"))["ssd_cache"] or {}
    return (f"decisions restore/recompute {st.get('decisions_restore')}/{st.get('decisions_recompute')}, "
            f"predicted restore {st.get('predicted_restore_ms', 0):.0f} ms vs recompute "
            f"{st.get('predicted_recompute_ms', 0):.0f} ms (read {st.get('read_bytes_per_s', 0) / 1e6:.0f} MB/s, "
            f"prefill {st.get('prefill_tokens_per_s', 0):.0f} tok/s), restores {st.get('restores')} blocks "
            f"({st.get('restore_bytes', 0) / 2**20:.0f} MiB) in {st.get('restore_ms_last', 0):.0f} ms, "
            f"verify failures {st.get('verify_failures')}")


def load():
    return "%.1f %.1f %.1f" % os.getloadavg()


def restart(args):
    rng = random.Random(7)
    prompt = [rng.randrange(100, 8000) for _ in range(args.prompt_len)]
    own = args.dir is None
    cache = args.dir or tempfile.mkdtemp(prefix="inferd-ssd-restart-")
    logs = tempfile.mkdtemp(prefix="inferd-ssd-restart-logs-")
    flags = ["--ctx", str(args.prompt_len + 64)] + [f for a in args.server_arg for f in a.split()]
    tier = flags + ["--ssd-cache", cache]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; model {args.model}; "
          f"prompt {args.prompt_len} random token ids; cache {cache}; serve {' '.join(flags)}")
    rows = []
    try:
        s = Server(args.inferd, args.model, tier, f"{logs}/a.err")
        client, engine, cached = first_token(s, prompt)
        rows.append(("cold (fresh directory)", client, engine, cached, load(), ""))
        t0 = time.perf_counter()
        status, body = s.post("/admin/cache/flush", {"timeout_ms": 600000})
        print(f"flush: HTTP {status} in {time.perf_counter() - t0:.2f} s: {json.dumps(body)}")
        print(f"exit status {s.stop()} after SIGTERM; "
              f"{[l for l in open(s.log) if 'at exit' in l][-1].strip()}")
        for label, drop in (("restart, page cache dropped", True), ("restart, page cache warm", False)):
            how = drop_page_cache() if drop else "kept"
            s = Server(args.inferd, args.model, tier, f"{logs}/{'b' if drop else 'c'}.err")
            client, engine, cached = first_token(s, prompt)
            rows.append((label, client, engine, cached, load(), f"page cache {how}; {tier_line(s)}"))
            s.stop()
        if args.cold_off:
            s = Server(args.inferd, args.model, flags + ["--prompt-cache", "0"], f"{logs}/d.err")
            client, engine, cached = first_token(s, prompt)
            rows.append(("cold (--prompt-cache 0)", client, engine, cached, load(), ""))
            s.stop()
    finally:
        if own:
            shutil.rmtree(cache, ignore_errors=True)
    cold = rows[0][1]
    print()
    print("| run | TTFT client | TTFT engine | cached_tokens | of cold | load average |")
    print("|---|---|---|---|---|---|")
    for label, client, engine, cached, la, _ in rows:
        print(f"| {label} | {client:.3f} s | {engine:.3f} s | {cached} | {100 * client / cold:.1f}% | {la} |")
    print()
    for label, *_, note in rows:
        if note:
            print(f"{label}: {note}")
    print(f"server logs in {logs}")


def settle(server, timeout=120):
    """Waits until the server's tier has nothing left to write (queued or not yet queued), so
    one round's writes never run into another server's round. Returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        st = json.loads(server.get("/stats"))["ssd_cache"]
        if st["pending"] + st.get("unqueued", 0) == 0:
            break
        time.sleep(0.05)
    return time.perf_counter() - t0


class WriteWatch:
    """Polls a tier-on server's /stats while a stream runs and notes when its writes (queued or not
    yet queued) were last seen pending, so the report can say how much of the decode they
    overlapped. It stops polling once they are drained after it has seen them, so a drained tier
    is not asked again."""

    def __init__(self, server, every=0.05):
        self.server, self.every = server, every
        self.last_pending = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        seen = False
        while not self.stop.is_set():
            st = json.loads(self.server.get("/stats"))["ssd_cache"]
            if st["pending"] + st.get("unqueued", 0) > 0:
                seen = True
                self.last_pending = time.perf_counter()
            elif seen:
                return
            self.stop.wait(self.every)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.last_pending


def median(xs):
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def decode_once(args, off_first):
    """One set of servers, every round; prints the report and returns each tier-on server's
    median on/off ratio."""
    flags = [f for a in args.server_arg for f in a.split()]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    modes = args.direct_io or ["auto"]
    bans = serve_tax.eos_ids(args.model)
    rng = random.Random(3)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; model {args.model}; "
          f"{'tier-off server started first; ' if off_first else ''}prompt "
          f"{args.prompt_len} fresh random ids per round, {args.gen_len} tokens decoded, "
          f"{args.rounds} rounds, servers interleaved (order rotated and reversed each round, each "
          f"tier's writes drained before the next stream); serve {' '.join(flags)}")
    logs = tempfile.mkdtemp(prefix="inferd-ssd-decode-logs-")
    caches, servers = [], []  # (name, server)
    try:
        # --off-first: the tier-off server starts (and takes its GPU memory) before the others
        off = Server(args.inferd, args.model, flags, f"{logs}/off.err") if off_first else None
        for mode in modes:
            cache = tempfile.mkdtemp(prefix="inferd-ssd-decode-")
            caches.append(cache)
            name = f"on/{mode}"
            servers.append((name, Server(args.inferd, args.model,
                                         flags + ["--ssd-cache", cache, "--ssd-direct-io", mode],
                                         f"{logs}/on-{mode}.err")))
        servers.append(("off", off or Server(args.inferd, args.model, flags, f"{logs}/off.err")))
        names = [n for n, _ in servers]
        rates = {n: [] for n in names}
        overlaps = {n: [] for n in names}
        for _, srv in servers:  # warm-up
            serve_tax.stream_once(srv.host, srv.port, [1, 2, 3], 4, bans)
        for r in range(args.rounds):
            order = servers[r % len(servers):] + servers[:r % len(servers)]
            if (r // len(servers)) % 2:
                order = order[::-1]
            for name, srv in order:
                prompt = [rng.randrange(100, 8000) for _ in range(args.prompt_len)]
                watch = WriteWatch(srv) if name != "off" and args.watch_writes else None
                times = []
                _, rate, n = serve_tax.stream_once(srv.host, srv.port, prompt, args.gen_len, bans,
                                                   times)
                if rate is None:
                    raise SystemExit("ssd_restart: a stream sent fewer than 2 text chunks")
                rates[name].append(rate)
                overlap = ""
                if watch:
                    last = watch.finish()
                    span = times[-1] - times[0]
                    busy = min(max((last or 0) - times[0], 0.0), span)
                    overlaps[name].append(busy / span)
                    overlap = f"writes pending during {100 * busy / span:.0f}% of the decode; "
                waited = settle(srv) if name != "off" else 0.0
                print(f"round {r + 1}, tier {name:8s}: {rate:7.2f} tok/s decode ({n} tokens; "
                      f"{overlap}writes drained {waited:.2f} s after; load average {load()})",
                      flush=True)
        stats = {name: json.loads(srv.get("/stats"))["ssd_cache"] for name, srv in servers
                 if name != "off"}
    finally:
        for _, srv in servers:
            srv.stop()
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    print()
    print("| round | " + " | ".join(f"tier {n}" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for r in range(args.rounds):
        print(f"| {r + 1} | " + " | ".join(f"{rates[n][r]:.2f}" for n in names) + " |")
    print()
    off = rates["off"]
    moff, medoff = sum(off) / len(off), median(off)
    print(f"tier off: mean {moff:.2f} tok/s, median {medoff:.2f}")
    ratios = {}
    for name in names[:-1]:
        on = rates[name]
        mon, medon = sum(on) / len(on), median(on)
        paired = median([a / b for a, b in zip(on, off)])
        st = stats[name]
        print(f"tier {name}: mean {mon:.2f} tok/s ({100 * (mon / moff - 1):+.1f}%), median "
              f"{medon:.2f} ({100 * (medon / medoff - 1):+.1f}%), median of the rounds' on/off "
              f"ratios {100 * (paired - 1):+.1f}% (target: no more than 2% below); "
              + (f"writes pending during {100 * sum(overlaps[name]) / len(overlaps[name]):.0f}% "
                 f"of the decode on average; " if overlaps[name] else "") +
              f"direct_io {str(st.get('direct_io')).lower()}, {st['writes']} blocks "
              f"({st['write_bytes'] / 2**20:.0f} MiB) written in {st.get('write_calls')} write "
              f"calls ({st.get('in_place_writes', 0)} from where the data lies), I/O thread CPU "
              f"{st.get('io_cpu_ms', 0):.0f} ms, {st['pending']} pending, "
              f"{st['dropped']} dropped, {st['failed']} failed")
        ratios[name] = paired
    return ratios


def decode(args):
    """--both-orders: the whole measurement twice, the tier-off server started last and then
    first (on the GPU the server started first measured ~1% slower than the one after it, the
    same binary either way), and the two paired medians averaged."""
    if not args.both_orders:
        decode_once(args, args.off_first)
        return
    last = decode_once(args, False)
    print()
    first = decode_once(args, True)
    print()
    for name in last:
        both = (last[name] + first[name]) / 2
        print(f"tier {name}, both start orders: median on/off ratio {100 * (last[name] - 1):+.1f}% "
              f"(off started last), {100 * (first[name] - 1):+.1f}% (off started first), mean "
              f"{100 * (both - 1):+.1f}% (target: no more than 2% below)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["restart", "decode"])
    p.add_argument("inferd")
    p.add_argument("model")
    p.add_argument("--prompt-len", type=int)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--rounds", type=int, help="decode: rounds of every server (default 8)")
    p.add_argument("--threads", type=int,
                   help="decode: the servers' CPU thread count (--threads; default: theirs)")
    p.add_argument("--direct-io", action="append", choices=["auto", "on", "off"],
                   help="decode: a tier-on server with this --ssd-direct-io (repeatable: one "
                        "server each, all against the same tier-off server; default auto)")
    p.add_argument("--dir")
    p.add_argument("--cold-off", action="store_true")
    p.add_argument("--off-first", action="store_true",
                   help="decode: start the tier-off server before the tier-on ones")
    p.add_argument("--both-orders", action="store_true",
                   help="decode: measure with the tier-off server started last, then first")
    p.add_argument("--watch-writes", action="store_true",
                   help="decode: report how much of each decode the writes overlapped")
    p.add_argument("--server-arg", action="append", default=[],
                   help="more `inferd serve` flags, e.g. '--threads 2' (repeatable)")
    args = p.parse_args()
    if args.what == "restart":
        args.prompt_len = args.prompt_len or 8000
        restart(args)
    else:
        args.prompt_len = args.prompt_len or 512
        args.rounds = args.rounds or 8
        decode(args)


if __name__ == "__main__":
    main()
