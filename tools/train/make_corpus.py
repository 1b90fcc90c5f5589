#!/usr/bin/env python3
"""tools/train/make_corpus.py — assembles the house models' English corpus from Debian packages.

Installs the source packages when missing (apt-get, idempotent), turns each
source into documents in a fixed order, and splits them: within each source,
every 50th document (index % 50 == 49) is held out for evaluation (2%).

Writes, under --out (default build/house-corpus):
  train.jsonl    one {"source": ..., "text": ...} per line, training documents
  heldout.jsonl  the held-out documents, same form
  manifest.json  package versions, document/byte counts per source
and, with --heldout-txt, the held-out text as the evaluation stream the
perplexity golden uses: held-out documents joined by "<|endoftext|>".

Standard library only; the output is a pure function of the package contents.
"""
import argparse
import base64
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

PACKAGES = ["bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min", "dict-devil", "jargon-text"]
FORTUNE_DIR = "/usr/share/games/fortunes"
FORTUNE_SKIP = {"ascii-art"}  # pictures drawn in characters, not text
DEVIL_DICT = "/usr/share/dictd/devil.dict.dz"
DEVIL_INDEX = "/usr/share/dictd/devil.index"
JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
HOLDOUT_EVERY = 50
EOT = "<|endoftext|>"


def installed_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    status, _, version = r.stdout.partition("\t")
    return version if status.endswith(" installed") else None


def ensure_packages():
    missing = [p for p in PACKAGES if installed_version(p) is None]
    if missing:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + missing,
                       check=True, env=env)
    return {p: installed_version(p) for p in PACKAGES}


def clean(text):
    """Expands tabs, strips trailing spaces on each line and blank lines at both ends."""
    lines = [ln.expandtabs(4).rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def kjv_documents():
    """One document per chapter: its verses, one per line, without verse numbers."""
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, check=True,
                         env=dict(os.environ, COLUMNS="100000")).stdout.decode("utf-8")
    verse = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    docs, key, lines = [], None, []
    for line in out.split("\n"):
        m = verse.match(line)
        if not m:
            continue
        k = (m.group(1), m.group(2))
        if k != key and lines:
            docs.append("\n".join(lines))
            lines = []
        key = k
        lines.append(m.group(4).strip())
    if lines:
        docs.append("\n".join(lines))
    return docs


def mostly_letters(text):
    chars = [c for c in text if not c.isspace()]
    return chars and sum(c.isalpha() for c in chars) >= 0.6 * len(chars)


def fortune_documents():
    """Every cookie of every English fortune file, in file-name order then file order."""
    names = sorted(n[:-3] for n in os.listdir(FORTUNE_DIR) if n.endswith(".u8"))
    docs = []
    for name in names:
        if name in FORTUNE_SKIP:
            continue
        with open(os.path.join(FORTUNE_DIR, name + ".u8"), encoding="utf-8", errors="replace") as f:
            raw = f.read()
        for cookie in re.split(r"^%\s*$", raw, flags=re.M):
            text = clean(cookie)
            if len(text) >= 20 and mostly_letters(text):
                docs.append(text)
    return docs


def devil_documents():
    """The Devil's Dictionary: one document per entry, in the book's order."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(s):
        n = 0
        for c in s:
            n = n * 64 + alphabet.index(c)
        return n

    raw = gzip.open(DEVIL_DICT).read()
    spans = set()
    with open(DEVIL_INDEX, encoding="utf-8") as f:
        for line in f:
            word, off, length = line.rstrip("\n").split("\t")[:3]
            if not word.startswith("00database"):
                spans.add((b64(off), b64(length)))
    docs = []
    for off, length in sorted(spans):
        text = clean(raw[off:off + length].decode("utf-8", errors="replace"))
        if len(text) >= 20:
            docs.append(text)
    return docs


def jargon_documents():
    """The Jargon File: one document per glossary entry, then one per appendix section."""
    text = gzip.open(JARGON).read().decode("utf-8", errors="replace")
    lines = text.replace("\u00a0", " ").split("\n")
    entry = re.compile(r"^   :[^ ].*:")
    first = next(i for i, ln in enumerate(lines) if entry.match(ln))
    appendix = next(i for i, ln in enumerate(lines) if ln.startswith("Appendix A."))
    docs, cur = [], []

    def flush():
        text = clean("\n".join(ln[3:] if ln.startswith("   ") else ln for ln in cur))
        text = re.sub(r"\{([^{}]*)\}", r"\1", text)  # {cross-references} become plain words
        if len(text) >= 20:
            docs.append(text)
        cur.clear()

    for i in range(first, len(lines)):
        ln = lines[i]
        starts = entry.match(ln) if i < appendix else (ln[:1].isalpha())
        if starts and cur:
            flush()
        cur.append(ln)
    flush()
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/house-corpus")
    ap.add_argument("--heldout-txt", help="also write the held-out evaluation stream here")
    args = ap.parse_args()

    versions = ensure_packages()
    sources = [("kjv", kjv_documents()), ("fortunes", fortune_documents()),
               ("devil", devil_documents()), ("jargon", jargon_documents())]
    os.makedirs(args.out, exist_ok=True)
    manifest = {"packages": versions, "holdout": f"index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1} "
                "within each source", "sources": {}}
    heldout_texts = []
    with open(os.path.join(args.out, "train.jsonl"), "w", encoding="utf-8") as tr, \
         open(os.path.join(args.out, "heldout.jsonl"), "w", encoding="utf-8") as ho:
        for name, docs in sources:
            stats = {"documents": len(docs), "bytes": 0, "heldout_documents": 0, "heldout_bytes": 0}
            for i, text in enumerate(docs):
                # The separator must never occur inside a document.
                text = text.replace(EOT, "")
                line = json.dumps({"source": name, "text": text}, ensure_ascii=False) + "\n"
                n = len(text.encode("utf-8"))
                stats["bytes"] += n
                if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1:
                    ho.write(line)
                    heldout_texts.append(text)
                    stats["heldout_documents"] += 1
                    stats["heldout_bytes"] += n
                else:
                    tr.write(line)
            manifest["sources"][name] = stats
    stream = EOT.join(heldout_texts)
    manifest["heldout_sha256"] = hashlib.sha256(stream.encode("utf-8")).hexdigest()
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    if args.heldout_txt:
        with open(args.heldout_txt, "w", encoding="utf-8") as f:
            f.write(stream)
    json.dump(manifest, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
