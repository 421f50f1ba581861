#!/bin/bash
# Inputs of the 1.7.1 run.  Stops, with one line each, at the two things this machine lacks
# (../README.md, "Why it has not run"): the 1.7.1 tree and a 1.7.1 CPU builder on a base image
# that can be made here.  Past them it does what ../../torch-1.13.1-cpu/repeat/00-setup.sh does.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$STATE"

# 1. The tree: bullseye's orig tarball, which the archive reachable here does not serve (404).
#    A site that has it puts it at $TARBALL; it is checked by sha256 before anything uses it.
if [ ! -f "$TARBALL" ]; then
  echo "setup: $TARBALL is missing (bullseye's pytorch_1.7.1.orig.tar.gz; not served by this archive)" >&2
  exit 2
fi
echo "$TARBALL_SHA256  $TARBALL" | sha256sum -c --status || { echo "setup: sha256 mismatch: $TARBALL" >&2; exit 3; }

# 2. The builder: the matrix builds 1.7.1 on ubuntu-18_04 (its cu102 toolchain needs gcc <= 8),
#    an image mmdebstrap cannot make; a bullseye CPU builder (Python 3.9, gcc 9) is not in the
#    matrix yet.
image=$("$PATCHER" matrix --torch 1.7.1 --cuda none --python 3.9 --gcc 9 --json 2>/dev/null \
        | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["image"]["codename"])' || true)
if [ "$image" != "bullseye" ]; then
  echo "setup: the matrix has no bullseye CPU builder for torch 1.7.1 (resolves to '${image:-nothing}')" >&2
  exit 4
fi

# 3. From here on as for 1.13.1: the mirror, the pinned base image, the runtime image, the key.
(cd "$REPO" && "$PY" -c 'import sys; from pathlib import Path
from tests.fixtures.realtree import ensure_realtree_mirror
print("mirror commit", ensure_realtree_mirror(Path(sys.argv[1]), "1.7.1").commit)' "$STATE")
port=${REGISTRY_PORT:?start a docker-registry on loopback as ../../torch-1.13.1-cpu/repeat/00-setup.sh does}
pinned=$("$PATCHER" base-image --suite bullseye --tag "$BASE_TAG" --push "127.0.0.1:$port" --json \
         | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pushed"])')
printf '\n[overrides.images]\n"debian-bullseye" = "%s"\n' "$pinned" >> "$STATE/config.toml"
docker build -q --build-arg "BASE=$BASE_TAG" -f "$RUN_DIR/repeat/runtime.Dockerfile" -t "$RUNTIME_IMAGE" \
  "$RUN_DIR/repeat"
[ -f "$PATCHER_KEY_PATH" ] || "$PATCHER" keys generate --out "$PATCHER_KEY_PATH"
