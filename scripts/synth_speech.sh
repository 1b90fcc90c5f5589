#!/usr/bin/env bash
# Speaks each line of a text corpus with espeak-ng (varied voices, speeds and pitch; noise is
# added at training time) into OUT/NNNNNN.wav + OUT/NNNNNN.txt, for scripts/train_whisper_house.py.
# Runs on the CPU machine (espeak-ng is a Debian package, installed by scripts/bootstrap.sh);
# carry OUT (or a FLAC-compressed copy: OUT/*.wav -> flac) to the GPU machine.
# usage: scripts/synth_speech.sh CORPUS.txt OUT [MAX_LINES]
set -euo pipefail
corpus=${1:?corpus text file, one utterance a line}
out=${2:?output directory}
max=${3:-100000}
command -v espeak-ng >/dev/null || { echo "synth_speech: espeak-ng is missing (scripts/bootstrap.sh)" >&2; exit 1; }
mkdir -p "$out"
voices=(en-us en-gb en-gb-scotland en-gb-x-rp en-us+f2 en-us+m3 en-gb+f4 en-029 en-us+m7 en-gb-x-gbclan)
i=0
while IFS= read -r line && [ "$i" -lt "$max" ]; do
    line=$(printf '%s' "$line" | tr -s '[:space:]' ' ' | sed 's/^ //; s/ $//')
    [ -n "$line" ] || continue
    [ ${#line} -le 400 ] || line=${line:0:400}
    id=$(printf '%06d' "$i")
    # a deterministic spread: the line number picks voice, speed (120..200 wpm) and pitch (30..70)
    voice=${voices[$((i % ${#voices[@]}))]}
    speed=$((120 + (i * 37) % 81))
    pitch=$((30 + (i * 53) % 41))
    espeak-ng -v "$voice" -s "$speed" -p "$pitch" -w "$out/$id.wav" -- "$line"
    printf '%s\n' "$line" >"$out/$id.txt"
    i=$((i + 1))
done <"$corpus"
echo "synth_speech: $i utterances in $out"
