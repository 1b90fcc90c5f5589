"""scripts/wer.py — the word error rate as the Whisper scripts score it: lowercase words without
punctuation, Levenshtein distance over words. Standard library only (the training script and
bench/whisper_rtf.py import it; tests/e2e/speech.test.mjs scores the same way in JavaScript)."""
import re


def words(text):
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def edit_distance(r, h):
    """Word edits (substitutions, insertions, deletions) turning the list r into the list h."""
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[:], i
        for j in range(1, len(h) + 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
    return d[len(h)]
