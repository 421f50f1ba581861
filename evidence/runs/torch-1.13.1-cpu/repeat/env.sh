# Settings shared by the steps of the recorded run (sourced, not run).
# Everything the run makes lives under $STATE (outside the checkout), except what
# record_run.py copies into the run folder.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
RUN_DIR=${PATCHER_RUN_DIR:-$REPO/evidence/runs/torch-1.13.1-cpu}  # where the run is recorded
REPEAT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # these scripts and the runtime image's Dockerfile
STATE=${PATCHER_RUN_STATE:-/tmp/patcher-run-torch-1.13.1-cpu}
PATCHER=$REPO/.venv/bin/patcher
PY=$REPO/.venv/bin/python
RECORD="$PY $REPO/evidence/runs/record_run.py"
BUILD_ID=torch-1.13.1-cpu.pt1-py3.9
VOLUME=${PATCHER_RUN_CCACHE_VOLUME:-patcher-ccache-1.13.1-none-run}
RUNTIME_IMAGE=patcher-run/torch-1.13.1-cpu-runtime:bullseye
BASE_TAG=patcher-run/debian:bullseye-minbase
# The wheel's one dependency (torch 1.13.1 requires typing_extensions), pinned by hash.
TE_VERSION=4.12.2
TE_SHA256=04e5ca0351e0f3f85c6853954072df659d0d13fac324d0072316b67d7794700d
export PATCHER_CONFIG=$STATE/config.toml
export PATCHER_CACHE_DIR=$STATE/cache
export PATCHER_KEY_PATH=$STATE/signing-key.pem
export DOCKER_BUILDKIT=0  # the engine here has no buildx; the classic builder is what patcher uses too

record_value() {  # record_value RECORD_JSON EXPRESSION  (python expression over `r`)
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
