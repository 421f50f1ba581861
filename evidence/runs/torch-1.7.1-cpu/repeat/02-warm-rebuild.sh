#!/bin/bash
# The warm rebuild with the ccache volume the cold build filled, in a new work directory, up to
# the wheel (../../torch-1.13.1-cpu/repeat/03-warm-rebuild.sh changes one patch first; with no
# 1.7.1 series yet there is no patch to change, so this is a plain rebuild).
set -euo pipefail
source "$(dirname "$0")/env.sh"
rm -rf "$STATE/work-warm"
command=("$PATCHER" build --torch 1.7.1 --cuda none --python 3.9 --gcc 9 --work "$STATE/work-warm" --jobs 2 \
         --ccache-volume "$VOLUME" --until wheel)
echo "${command[*]}" > "$STATE/warm-command.txt"
"${command[@]}" 2>&1 | tee "$RUN_DIR/steps/02-warm-build.txt"
