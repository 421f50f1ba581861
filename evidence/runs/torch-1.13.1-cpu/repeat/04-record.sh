#!/bin/bash
# Gather the run into the run folder (run.json, records, logs) and stop the loopback registry.
set -euo pipefail
source "$(dirname "$0")/env.sh"
COLD=${COLD_BUILD_DIR:-$STATE/work-cold/$BUILD_ID}
args=(collect --run-dir "$RUN_DIR" --cold "$COLD" --cold-command "$(cat "$STATE/cold-command.txt")")
if [ -f "$STATE/work-warm/$BUILD_ID/record.json" ]; then
  args+=(--warm "$STATE/work-warm/$BUILD_ID" --warm-command "$(cat "$STATE/warm-command.txt")"
         --warm-change "PT-0102: a comment in aten/src/ATen/native/LossCTC.cpp reworded over two lines (warm-change.diff)")
fi
if [ -f "$RUN_DIR/probe-report.json" ]; then args+=(--probe-report "$RUN_DIR/probe-report.json"); fi
$RECORD "${args[@]}"
if [ -s "$STATE/registry.pid" ]; then kill "$(cat "$STATE/registry.pid")" 2>/dev/null || true; rm -f "$STATE/registry.pid"; fi
