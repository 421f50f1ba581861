#!/bin/bash
# Fetch the real upstream inputs the tests use from the Debian archive this machine's apt is
# configured with (the URI is read at run time, never written down), each checked by sha256:
# PyTorch 1.13.1 (Debian's orig tarball, the real upstream tree without submodules) and
# fmt 7.1.3 (bullseye's fmtlib orig tarball: the real third_party/fmt source); PyTorch 2.6.0
# (trixie's `pytorch` 2.6.0+dfsg-7 orig tarball, sha256 from trixie's Sources index), the same
# kind of real upstream tree.  bullseye's 1.7.1 orig tarball (pytorch_1.7.1.orig.tar.gz, sha256
# fc8d6aaf0bdedd4221617be8d47ac39af57605bdcc814fabc28739427b55e9c7 in bullseye's Sources) is
# not served by the archive this machine reaches (404, 2026-12-01), so no 1.7.1 tree is fetched.
set -euo pipefail
CACHE=${PATCHER_CI_CACHE:-/var/cache/patcher-ci}
DEST="$CACHE/debian-src"
mkdir -p "$DEST"
MIRROR=$(python3 "$(dirname "$0")/../patcher/hostapt.py")

fetch() {  # fetch POOL_PATH SHA256
  local name; name=$(basename "$1")
  if [ -f "$DEST/$name" ] && echo "$2  $DEST/$name" | sha256sum -c --status; then return 0; fi
  curl -fsSL --retry 3 -o "$DEST/$name.part" "$MIRROR/$1"
  echo "$2  $DEST/$name.part" | sha256sum -c --status || { echo "sha256 mismatch: $name" >&2; rm -f "$DEST/$name.part"; exit 1; }
  mv "$DEST/$name.part" "$DEST/$name"
}
fetch pool/main/p/pytorch/pytorch_1.13.1+dfsg.orig.tar.xz d0355588b8528566d477e6ebf1b4d9d036a6fd75711339f66b27472ce5879dc7
fetch pool/main/f/fmtlib/fmtlib_7.1.3+ds1.orig.tar.gz 56f46293763b9acbe362e66cebdd9b1299cfdfe66ac68009a3fc0364afc66cf4
fetch pool/main/p/pytorch/pytorch_2.6.0+dfsg.orig.tar.xz 099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff
echo "sources in $DEST"

# The real v1.4.0 / v1.7.1 / v1.8.1 trees: a shallow git mirror (every submodule commit too) that
# the project keeps beside the checkouts (../shared/sources, its README says what it holds).
# Unpacked once into $CACHE/pytorch-git-mirror/git/ORG/REPO.git; the sha256 it was unpacked
# from is written last, so a half-unpacked copy is never taken for a finished one.
GIT_MIRROR_TAR=${PATCHER_GIT_MIRROR_TAR:-$(dirname "$0")/../../shared/sources/pytorch-git-mirror.tar}
GIT_MIRROR_SHA256=0ad18495d37d60c4a671dd2f952653e25bf0ab59f678de0e82142faa63f52e6b
GIT_MIRROR_DEST="$CACHE/pytorch-git-mirror"
if [ "$(cat "$GIT_MIRROR_DEST/UNPACKED-FROM" 2>/dev/null)" != "$GIT_MIRROR_SHA256" ]; then
  echo "$GIT_MIRROR_SHA256  $GIT_MIRROR_TAR" | sha256sum -c --status \
    || { echo "sha256 mismatch or missing: $GIT_MIRROR_TAR" >&2; exit 1; }
  staging=$(mktemp -d "$CACHE/.pytorch-git-mirror.unpack-XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  chmod 755 "$staging"
  tar -xf "$GIT_MIRROR_TAR" -C "$staging"
  echo "$GIT_MIRROR_SHA256" > "$staging/UNPACKED-FROM"
  rm -rf "$GIT_MIRROR_DEST"
  mv "$staging" "$GIT_MIRROR_DEST"
  trap - EXIT
fi
echo "git mirror in $GIT_MIRROR_DEST/git"
