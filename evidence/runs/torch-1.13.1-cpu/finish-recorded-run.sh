#!/bin/bash
# For this recording only (paths of the machine it ran on).  The cold build was started at
# 02:50 UTC, before this folder existed, as
#   PATCHER_CONFIG=/tmp/build/real-config.toml PATCHER_CACHE_DIR=/tmp/build/cache \
#   patcher build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 \
#       --ccache-volume patcher-ccache-1.13.1-none-h9full
# i.e. without a probe image, wheelhouse or signing key: its own probe stage runs in the builder
# image, which has no venv, so it stops there after the wheel.  This script continues that same
# build with --resume (probe and certify stages, as 01-cold-build.sh would have run them), then
# runs steps 02-04 of repeat/ against it.  $STATE/config.toml is a copy of real-config.toml.
set -euo pipefail
cd "$(dirname "$0")"
export PATCHER_RUN_STATE=${PATCHER_RUN_STATE:-/tmp/run1131}
export PATCHER_RUN_CCACHE_VOLUME=patcher-ccache-1.13.1-none-h9full
source repeat/env.sh
export COLD_BUILD_DIR=/tmp/build/w3/$BUILD_ID
cmp "$PATCHER_CONFIG" /tmp/build/real-config.toml
echo "PATCHER_CONFIG=/tmp/build/real-config.toml PATCHER_CACHE_DIR=/tmp/build/cache $PATCHER build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 --ccache-volume $VOLUME" \
  > "$STATE/cold-command.txt"
mkdir -p "$RUN_DIR/steps"
[ -f "$PATCHER_KEY_PATH" ] || "$PATCHER" keys generate --out "$PATCHER_KEY_PATH"

if ! grep -q '"certify"' "$COLD_BUILD_DIR/record.json"; then
  PATCHER_CACHE_DIR=/tmp/build/cache "$PATCHER" build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 \
    --ccache-volume "$VOLUME" --resume --probe-image "$RUNTIME_IMAGE" --probe-wheelhouse "$STATE/wheelhouse" \
    2>&1 | tee "$RUN_DIR/steps/01-resume-probe-certify.txt"
fi
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$COLD_BUILD_DIR/record.json" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-cold.json"
bash repeat/02-install-probe-certify-publish.sh
if [ "${SKIP_WARM:-}" != 1 ]; then bash repeat/03-warm-rebuild.sh; fi
bash repeat/04-record.sh
