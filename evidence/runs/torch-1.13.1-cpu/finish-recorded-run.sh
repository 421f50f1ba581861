#!/bin/bash
# For this recording only (paths of the machine it ran on).  The cold build was started at
# 02:50 UTC, before this folder existed, as
#   PATCHER_CONFIG=/tmp/build/real-config.toml PATCHER_CACHE_DIR=/tmp/build/cache \
#   patcher build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 \
#       --ccache-volume patcher-ccache-1.13.1-none-h9full
# without a probe image, wheelhouse or signing key.  At 03:13:40 UTC that `patcher build`
# process ended without a word (killed with the session that started it; its log stops at
# ninja step 200/1255) while its wheel container went on compiling into the ccache volume
# (paused from 03:14:44 to 03:35:27 UTC, then running again).  Nobody collects that
# container's wheel, so this script:
#   1. waits for the orphaned container to finish, records its times and exit status
#      (cold-container.json), copies its wheel out for comparison, removes it;
#   2. continues the same build with `patcher build --resume`: the wheel stage runs again in a
#      fresh container (ccache now holds every object), then probe and certify, as
#      01-cold-build.sh would have run them;
#   3. runs steps 02-04 of repeat/ against that build.
# $STATE/config.toml is a copy of /tmp/build/real-config.toml.
set -euo pipefail
cd "$(dirname "$0")"
export PATCHER_RUN_STATE=${PATCHER_RUN_STATE:-/tmp/run1131}
export PATCHER_RUN_CCACHE_VOLUME=patcher-ccache-1.13.1-none-h9full
source repeat/env.sh
export COLD_BUILD_DIR=/tmp/build/w3/$BUILD_ID
ORPHAN=${ORPHAN:-patcher-torch-1.13.1-cpu.pt1-py3.9-wheel-7487972b}
cmp "$PATCHER_CONFIG" /tmp/build/real-config.toml
echo "PATCHER_CONFIG=/tmp/build/real-config.toml PATCHER_CACHE_DIR=/tmp/build/cache $PATCHER build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 --ccache-volume $VOLUME" \
  > "$STATE/cold-command.txt"
mkdir -p "$RUN_DIR/steps"
[ -f "$PATCHER_KEY_PATH" ] || "$PATCHER" keys generate --out "$PATCHER_KEY_PATH"

# 1. the orphaned cold container
if docker inspect "$ORPHAN" >/dev/null 2>&1; then
  echo "waiting for $ORPHAN ($(docker logs --tail 1 "$ORPHAN" 2>&1 | cut -c1-60))"
  docker wait "$ORPHAN"
  docker logs "$ORPHAN" > "$STATE/orphan.log" 2>&1 || true
  gzip -n -c "$STATE/orphan.log" > "$RUN_DIR/build-cold-container.log.gz"
  $RECORD container --name "$ORPHAN" --out "$RUN_DIR/cold-container.json" \
    --note "the cold wheel stage's container, orphaned at 03:13:40 UTC when its patcher process was killed" \
    --note "paused from after 03:14:44 (its last line before the gap, ninja step 208) to 03:35:27 UTC (the engine's unpause event)" \
    --paused-s 1243
  rm -rf "$STATE/orphan-out"
  docker cp "$ORPHAN:/out" "$STATE/orphan-out" || true
  sha256sum "$STATE"/orphan-out/*.whl > "$RUN_DIR/steps/00-orphan-wheel.sha256" 2>/dev/null || true
  docker rm "$ORPHAN" >/dev/null
fi
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$COLD_BUILD_DIR/record.json" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-cold.json"

# 2. the same build, resumed: wheel (from the filled ccache), probe, certify
if ! grep -q '"certify"' "$COLD_BUILD_DIR/record.json"; then
  PATCHER_CONFIG=/tmp/build/real-config.toml PATCHER_CACHE_DIR=/tmp/build/cache \
  "$PATCHER" build --torch 1.13.1 --cuda none --work /tmp/build/w3 --jobs 2 \
    --ccache-volume "$VOLUME" --resume --probe-image "$RUNTIME_IMAGE" --probe-wheelhouse "$STATE/wheelhouse" \
    2>&1 | tee "$RUN_DIR/steps/01-resume-wheel-probe-certify.txt"
fi
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$COLD_BUILD_DIR/record.json" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-resume.json"

# 3. install, probe, certify, publish, pip --require-hashes; the one-patch warm rebuild; record
bash repeat/02-install-probe-certify-publish.sh
if [ "${SKIP_WARM:-}" != 1 ]; then bash repeat/03-warm-rebuild.sh; fi
bash repeat/04-record.sh
