#!/bin/bash
# The wheel after the build, each step a command of its own, outputs into the run folder:
#   1. install it into a fresh bullseye container (offline) and import torch
#   2. probe it (every check that applies to a CPU build; the patches' checks are required)
#   3. certify it, verify the evidence
#   4. publish it to a static index, serve that on loopback, and pip install it from there
#      with --require-hashes into a fresh venv (in the runtime container: the wheel is cp39)
set -euo pipefail
source "$(dirname "$0")/env.sh"
STEPS=$RUN_DIR/steps
mkdir -p "$STEPS" "$RUN_DIR/evidence"
BUILD=${COLD_BUILD_DIR:-$STATE/work-cold/$BUILD_ID}
record="$BUILD/record.json"
wheel="$BUILD/$(record_value "$record" 'r["wheel"]["path"]')"
name=$(basename "$wheel")
sha=$(record_value "$record" 'r["wheel"]["sha256"]')
ids=$(record_value "$record" '",".join(p["id"] for p in r["patches"])')
echo "$sha  $wheel" | sha256sum -c -

# 1. fresh container, no network: venv, offline install, import torch
docker run --rm --network none -v "$(dirname "$wheel"):/dist:ro" -v "$STATE/wheelhouse:/wheelhouse:ro" \
  "$RUNTIME_IMAGE" sh -c "python3 -m venv /venv && /venv/bin/pip install --quiet --no-index --find-links /wheelhouse \
  /dist/$name && cd / && /venv/bin/python -c 'import sys, torch; print(\"python\", sys.version.split()[0]); \
print(\"torch\", torch.__version__, torch.__file__); print(torch.__config__.show()); \
print(\"sum\", torch.arange(10.).sum().item(), \"matmul\", (torch.ones(64, 64) @ torch.ones(64, 64))[0, 0].item())'" \
  2>&1 | tee "$STEPS/02-import-torch.txt"

# 2. probe: the wheel in a clean venv of a fresh runtime container
"$PATCHER" probe --wheel "$wheel" --image "$RUNTIME_IMAGE" --wheelhouse "$STATE/wheelhouse" --patched-ids "$ids" \
  --json "$RUN_DIR/probe-report.json" --junit "$RUN_DIR/probe-report.xml" 2>&1 | tee "$STEPS/03-probe.txt"

# 3. certify into a folder of its own, export the public key, verify
rm -rf "$STATE/certified"
"$PATCHER" certify --record "$record" --probe-report "$RUN_DIR/probe-report.json" --out "$STATE/certified" \
  2>&1 | tee "$STEPS/04-certify.txt"
"$PATCHER" keys export --out "$RUN_DIR/evidence/signing-key.pub.pem" 2>&1 | tee -a "$STEPS/04-certify.txt"
"$PATCHER" verify "$STATE/certified/$name" --key "$RUN_DIR/evidence/signing-key.pub.pem" 2>&1 \
  | tee "$STEPS/05-verify.txt"
for f in "$STATE/certified/$name".*; do cp "$f" "$RUN_DIR/evidence/"; done

# 4. publish, serve on loopback, install with --require-hashes from the index
rm -rf "$STATE/index"
"$PATCHER" publish --index "$STATE/index" "$STATE/certified/$name" 2>&1 | tee "$STEPS/06-publish.txt"
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$STATE/index" "$port" > "$STATE/index-server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$port/simple/" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://127.0.0.1:$port/simple/torch/" > "$STEPS/07-index-torch-page.html"
mkdir -p "$STATE/req"
printf 'torch==1.13.1+cpu.pt1 --hash=sha256:%s\ntyping-extensions==%s --hash=sha256:%s\n' \
  "$sha" "$TE_VERSION" "$TE_SHA256" > "$STATE/req/requirements.txt"
cp "$STATE/req/requirements.txt" "$STEPS/07-requirements.txt"
# --network host: the index listens on the host's loopback only.  typing_extensions is not ours
# to publish: it comes from the wheelhouse (--find-links), pinned by hash like torch.
docker run --rm --network host -v "$STATE/req:/req:ro" -v "$STATE/wheelhouse:/wheelhouse:ro" "$RUNTIME_IMAGE" \
  sh -c "python3 -m venv /venv && /venv/bin/pip --version && /venv/bin/pip install --no-cache-dir --require-hashes \
  --index-url http://127.0.0.1:$port/simple/ --find-links /wheelhouse -r /req/requirements.txt && cd / && \
  /venv/bin/python -c 'import torch; print(\"installed from the index: torch\", torch.__version__)'" \
  2>&1 | tee "$STEPS/07-pip-install-require-hashes.txt"
