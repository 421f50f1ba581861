#!/bin/bash
# Inputs of the run, made on this machine (nothing can be pulled): Debian's real 1.13.1 tree as
# a git mirror, a bullseye base image pinned by digest, the runtime image, the dependency
# wheelhouse and a signing key.  Idempotent; about 5 minutes on 2 cores.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$STATE"

bash "$REPO/.ci/install-host.sh"     # mmdebstrap, docker-registry, git, ...
bash "$REPO/.ci/fetch-sources.sh"    # Debian's orig tarballs of pytorch 1.13.1 and fmt 7.1.3, by sha256

# 1. The git mirror (pytorch/pytorch.git with third_party/fmt as a real submodule) and a config
#    with git_mirror and the explicit override of the tag's commit (a re-imported tree).
(cd "$REPO" && "$PY" -c 'import sys; from pathlib import Path
from tests.fixtures.realtree import ensure_realtree_mirror
print("mirror commit", ensure_realtree_mirror(Path(sys.argv[1])).commit)' "$STATE")

# 2. The base image: mmdebstrap bullseye, pushed to a registry on loopback for its digest,
#    pinned in the config (the matrix's bullseye image cannot be pulled here).
if [ ! -s "$STATE/registry.pid" ] || ! kill -0 "$(cat "$STATE/registry.pid")" 2>/dev/null; then
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$STATE/registry"
  printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$STATE/registry/storage" "$port" > "$STATE/registry/config.yml"
  nohup docker-registry serve "$STATE/registry/config.yml" > "$STATE/registry/log" 2>&1 &
  echo $! > "$STATE/registry.pid"; echo "$port" > "$STATE/registry.port"
  for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
fi
port=$(cat "$STATE/registry.port")
pinned=$("$PATCHER" base-image --suite bullseye --tag "$BASE_TAG" --push "127.0.0.1:$port" --json \
         | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pushed"])')
printf '\n[overrides.images]\n"debian-bullseye" = "%s"\n' "$pinned" >> "$STATE/config.toml"
echo "config $STATE/config.toml:"; cat "$STATE/config.toml"

# 3. The runtime image (a fresh bullseye with Python 3.9 and the wheel's system libraries).
docker build -q --build-arg "BASE=$BASE_TAG" -f "$REPEAT_DIR/runtime.Dockerfile" -t "$RUNTIME_IMAGE" \
  "$REPEAT_DIR"

# 4. The wheelhouse of the wheel's dependency, checked against its pinned hash.
"$REPO/.venv/bin/pip" download --quiet --only-binary=:all: --python-version 3.9 --platform any --no-deps \
  "typing_extensions==$TE_VERSION" -d "$STATE/wheelhouse"
echo "$TE_SHA256  $STATE/wheelhouse/typing_extensions-$TE_VERSION-py3-none-any.whl" | sha256sum -c -

# 5. The key that signs the evidence (mode 0600, outside the checkout).
[ -f "$PATCHER_KEY_PATH" ] || "$PATCHER" keys generate --out "$PATCHER_KEY_PATH"
