#!/bin/bash
# The cold build (upstream's own tests of the series run in the probe stage): an empty ccache volume, every stage from resolve to certify.  The probe stage
# installs the wheel offline into a venv in the runtime image (with the wheelhouse for its
# dependency) and requires every check that proves a patch of the series; certify signs with
# $PATCHER_KEY_PATH.  About 100 minutes of compile on 2 cores.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$RUN_DIR/steps"
if [ -e "$STATE/work-cold" ]; then echo "$STATE/work-cold exists: remove it for a cold build" >&2; exit 1; fi
docker volume rm "$VOLUME" >/dev/null 2>&1 || true   # cold: this run's own ccache volume starts empty
# cold: no kept build tree either (--keep-build-tree keeps CMake and ninja state for the warm rebuild)
docker volume ls -q --filter "name=patcher-tree-torch-1.13.1" | xargs -r docker volume rm >/dev/null

command=("$PATCHER" build --torch 1.13.1 --cuda none --work "$STATE/work-cold" --jobs 2 \
         --ccache-volume "$VOLUME" --keep-build-tree --probe-image "$RUNTIME_IMAGE" --probe-wheelhouse "$STATE/wheelhouse" --upstream-tests)
echo "${command[*]}" > "$STATE/cold-command.txt"
"${command[@]}" 2>&1 | tee "$RUN_DIR/steps/01-cold-build.txt"

record="$STATE/work-cold/$BUILD_ID/record.json"
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$record" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-cold.json"
