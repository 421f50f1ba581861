#!/bin/bash
# Host packages the tests use, from the Debian archive apt is configured with.
#   mmdebstrap + uidmap: base images made locally (no image can be pulled)
#   docker-registry: a real OCI registry on loopback      python3-torch: a real legacy torch (1.13.1)
#   git, curl, xz-utils, dpkg-dev: real source trees       python3-venv: the project's virtualenv
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
#   unzip + libmagic1: diffoscope (patcher build --check-reproducible) compares wheels with them
#   chromium + poppler-utils + fonts-dejavu-core: `patcher report --pdf`, and the report tests render
#   the page in headless Chromium and its PDF pages with pdftoppm/pdftotext; gcc/g++/binutils: the SBOM
#   tests compile real ELF files and cross-check the ELF reader with readelf
PKGS="mmdebstrap uidmap docker-registry python3-torch python3-venv git curl xz-utils dpkg-dev ca-certificates make unzip libmagic1 chromium poppler-utils fonts-dejavu-core gcc g++ binutils"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
docker info >/dev/null 2>&1 || { echo "ci: the Docker engine is not running" >&2; exit 1; }
echo "ci: host packages ready"
