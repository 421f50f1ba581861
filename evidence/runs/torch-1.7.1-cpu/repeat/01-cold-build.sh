#!/bin/bash
# The cold build of the patched 1.7.1 tree (empty ccache volume, resolve to certify), as
# ../../torch-1.13.1-cpu/repeat/01-cold-build.sh; the wheel's probe runs in the runtime image.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$RUN_DIR/steps"
if [ -e "$STATE/work-cold" ]; then echo "$STATE/work-cold exists: remove it for a cold build" >&2; exit 1; fi
docker volume rm "$VOLUME" >/dev/null 2>&1 || true
command=("$PATCHER" build --torch 1.7.1 --cuda none --python 3.9 --gcc 9 --work "$STATE/work-cold" --jobs 2 \
         --ccache-volume "$VOLUME" --probe-image "$RUNTIME_IMAGE")
echo "${command[*]}" > "$STATE/cold-command.txt"
"${command[@]}" 2>&1 | tee "$RUN_DIR/steps/01-cold-build.txt"
record="$STATE/work-cold/$BUILD_ID/record.json"
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$record" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-cold.json"
