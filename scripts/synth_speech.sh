#!/usr/bin/env bash
# Speaks each line of a text corpus with espeak-ng (varied voices, speeds and pitch; noise is
# added at training time) into OUT/NNNNNN.wav + OUT/NNNNNN.txt, for scripts/train_whisper_house.py.
# JOBS espeak-ng processes run at once (default: the core count); one process is started per
# line and nothing else, since process start-up is what this costs on sandboxed machines.
# espeak-ng is a Debian package (scripts/bootstrap.sh installs it); where it is not installed,
# carry its binary, libraries and data and set ESPEAK_DATA_PATH.
# usage: scripts/synth_speech.sh CORPUS.txt OUT [MAX_LINES] [JOBS]
set -euo pipefail
corpus=${1:?corpus text file, one utterance a line}
out=${2:?output directory}
max=${3:-100000}
jobs=${4:-$(nproc)}
command -v espeak-ng >/dev/null || { echo "synth_speech: espeak-ng is missing (scripts/bootstrap.sh)" >&2; exit 1; }
mkdir -p "$out"
voices=(en-us en-gb en-gb-scotland en-gb-x-rp en-us+f2 en-us+m3 en-gb+f4 en-029 en-us+m7 en-gb-x-gbclan)

# Worker w speaks lines w, w + jobs, w + 2 jobs, ... of the first max lines.
speak() {
    local w=$1 i=0 line id
    while IFS= read -r line; do
        if [ "$i" -ge "$max" ]; then break; fi
        if [ $((i % jobs)) -eq "$w" ]; then
            line=${line//[$'\t\r']/ }
            while [[ $line == *"  "* ]]; do line=${line//  / }; done
            line=${line# }
            line=${line% }
            [ ${#line} -le 400 ] || line=${line:0:400}
            if [ -n "$line" ]; then
                printf -v id '%06d' "$i"
                # a deterministic spread: the line number picks voice, speed (120..200 wpm)
                # and pitch (30..70)
                espeak-ng -v "${voices[$((i % ${#voices[@]}))]}" -s $((120 + (i * 37) % 81)) \
                    -p $((30 + (i * 53) % 41)) -w "$out/$id.wav" -- "$line"
                printf '%s\n' "$line" >"$out/$id.txt"
            fi
        fi
        i=$((i + 1))
    done <"$corpus"
}
for ((w = 0; w < jobs; w++)); do speak "$w" & done
wait
echo "synth_speech: $(find "$out" -name '*.wav' | wc -l) utterances in $out"
