# Settings shared by the steps of the 1.7.1 run (sourced, not run); modelled on
# ../../torch-1.13.1-cpu/repeat/env.sh.  NOT RUN YET: see ../README.md.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
RUN_DIR=$REPO/evidence/runs/torch-1.7.1-cpu
STATE=${PATCHER_RUN_STATE:-/tmp/patcher-run-torch-1.7.1-cpu}
PATCHER=$REPO/.venv/bin/patcher
PY=$REPO/.venv/bin/python
RECORD="$PY $REPO/evidence/runs/record_run.py"
BUILD_ID=torch-1.7.1-cpu.pt1-py3.9
VOLUME=${PATCHER_RUN_CCACHE_VOLUME:-patcher-ccache-1.7.1-none-run}
RUNTIME_IMAGE=patcher-run/torch-1.7.1-cpu-runtime:bullseye
BASE_TAG=patcher-run/debian:bullseye-minbase
CACHE=${PATCHER_CI_CACHE:-/var/cache/patcher-ci}
# bullseye's pytorch 1.7.1-7 orig tarball, as bullseye's Sources index gives it
TARBALL=$CACHE/debian-src/pytorch_1.7.1.orig.tar.gz
TARBALL_SHA256=fc8d6aaf0bdedd4221617be8d47ac39af57605bdcc814fabc28739427b55e9c7
export PATCHER_CONFIG=$STATE/config.toml
export PATCHER_CACHE_DIR=$STATE/cache
export PATCHER_KEY_PATH=$STATE/signing-key.pem
export DOCKER_BUILDKIT=0

record_value() {  # record_value RECORD_JSON EXPRESSION  (python expression over `r`)
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
