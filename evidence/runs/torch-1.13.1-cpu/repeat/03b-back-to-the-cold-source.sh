#!/bin/bash
# After the warm rebuild (03): change the patch back, i.e. rebuild with the cold build's own
# catalog on the kept build tree, in a new work directory, up to the wheel.  The tree then holds
# exactly the cold build's source again, after one patch changed: the wheel must be the cold
# build's, byte for byte (issue 22: a kept-tree rebuild gives the wheel a cold build gives).
set -euo pipefail
source "$(dirname "$0")/env.sh"
rm -rf "$STATE/work-back"
mkdir -p "$RUN_DIR/steps"
command=("$PATCHER" build --torch 1.13.1 --cuda none --work "$STATE/work-back" --jobs 2 \
         --ccache-volume "$VOLUME" --keep-build-tree --until wheel)
echo "PATCHER_CATALOG=${PATCHER_CATALOG:-} ${command[*]}" > "$STATE/back-command.txt"
"${command[@]}" 2>&1 | tee "$RUN_DIR/steps/10-back-to-the-cold-source.txt"

cold=$(record_value "$STATE/work-cold/$BUILD_ID/record.json" 'r["wheel"]["sha256"]')
back=$(record_value "$STATE/work-back/$BUILD_ID/record.json" 'r["wheel"]["sha256"]')
echo "cold wheel sha256 $cold" | tee -a "$RUN_DIR/steps/10-back-to-the-cold-source.txt"
echo "back wheel sha256 $back" | tee -a "$RUN_DIR/steps/10-back-to-the-cold-source.txt"
if [ "$cold" = "$back" ]; then
  echo "identical: the rebuild after one patch changed (back) is the cold build's wheel" | tee -a "$RUN_DIR/steps/10-back-to-the-cold-source.txt"
else
  echo "DIFFERENT: the rebuild is not the cold build's wheel" | tee -a "$RUN_DIR/steps/10-back-to-the-cold-source.txt"
  exit 1
fi
