#!/usr/bin/env python3
"""scripts/speech_lines.py — utterances for the Whisper house model from the house corpus.

Splits the corpus documents (tools/train/make_corpus.py's train.jsonl / heldout.jsonl) into
sentences of 3 to 30 words that espeak-ng reads cleanly (letters, digits, light punctuation;
at most 200 characters), in corpus order, and writes one a line. Standard library only; the
output is a pure function of the input.

usage: speech_lines.py CORPUS.jsonl OUT.txt [MAX_LINES]
"""
import json
import re
import sys

KEEP = re.compile(r"[^A-Za-z0-9 ,.'?!;:-]")


def sentences(text):
    text = " ".join(text.split())
    for s in re.split(r"(?<=[.!?])\s+", text):
        s = KEEP.sub("", s).strip(" -;:,")
        if 3 <= len(s.split()) <= 30 and len(s) <= 200 and re.search(r"[A-Za-z]", s):
            yield s


def main():
    src, out = sys.argv[1], sys.argv[2]
    cap = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 30
    n = 0
    seen = set()
    with open(src) as f, open(out, "w") as w:
        for line in f:
            for s in sentences(json.loads(line)["text"]):
                if s.lower() in seen:
                    continue
                seen.add(s.lower())
                w.write(s + "\n")
                n += 1
                if n >= cap:
                    print(f"speech_lines: {n} lines in {out}")
                    return
    print(f"speech_lines: {n} lines in {out}")


if __name__ == "__main__":
    main()
