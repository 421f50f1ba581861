#!/bin/bash
# Install, probe, certify, verify, publish and pip install --require-hashes: the 1.13.1 run's
# step script, pointed at this run's settings (it reads REPO, RUN_DIR, STATE, BUILD_ID,
# RUNTIME_IMAGE from env.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
export COLD_BUILD_DIR=$STATE/work-cold/$BUILD_ID
sed -e "s|torch==1.13.1+cpu.pt1|torch==1.7.1+cpu.pt1|" \
  "$REPO/evidence/runs/torch-1.13.1-cpu/repeat/02-install-probe-certify-publish.sh" > "$STATE/step-02.sh"
# the 1.13.1 script sources its own env.sh: run it with this one's values instead
sed -i -e "s|^source .*env.sh\"$|source \"$RUN_DIR/repeat/env.sh\"|" "$STATE/step-02.sh"
bash "$STATE/step-02.sh"
