#!/bin/bash
# The warm rebuild: change one patch (PT-0102, a comment in one C++ file, one line longer, so
# LossCTC.cpp really recompiles), in a copy of the catalog, regenerated with git through
# `patcher patches apply/refresh`; then build again with the ccache volume the cold build filled,
# in a new work directory, up to the wheel.
set -euo pipefail
source "$(dirname "$0")/env.sh"
CATALOG=$STATE/catalog-warm
TREE=$STATE/edit-tree
rm -rf "$CATALOG" "$TREE" "$STATE/work-warm"
mkdir -p "$CATALOG" "$RUN_DIR/steps"
cp -r "${PATCHER_CATALOG:-$REPO}/patches" "${PATCHER_CATALOG:-$REPO}/dockerfiles" "$CATALOG/"  # the cold build's catalog

# The series as commits on the real tree, PT-0102's commit amended, the rest rebased onto it.
"$PATCHER" fetch --torch 1.13.1 -o "$TREE"
"$PATCHER" --catalog "$CATALOG" patches apply --torch 1.13.1 --source "$TREE"
export GIT_COMMITTER_NAME="patcher run" GIT_COMMITTER_EMAIL="run@patcher.invalid"
git -C "$TREE" branch -f series HEAD
old=$(git -C "$TREE" log --format=%H -n 1 --grep='^Patch-Id: PT-0102$')
git -C "$TREE" checkout -q --detach "$old"
"$PY" - "$TREE/aten/src/ATen/native/LossCTC.cpp" <<'PYEOF'
import sys
from pathlib import Path
path = Path(sys.argv[1])
text = path.read_text()
old = "  // Same refusal as the CUDA kernel, where an empty batch divides by zero (CVE-2025-3730).\n"
new = ("  // Refused here as in the CUDA kernel, where an empty batch divides by zero when the launch\n"
       "  // is sized (CVE-2025-3730); this kernel would return an empty loss instead.\n")
assert text.count(old) == 1, "PT-0102's comment is not where this script expects it"
path.write_text(text.replace(old, new))
PYEOF
git -C "$TREE" commit -q -a --amend --no-edit
git -C "$TREE" rebase -q --onto HEAD "$old" series
"$PATCHER" --catalog "$CATALOG" patches refresh --torch 1.13.1 --source "$TREE" | tee "$RUN_DIR/steps/08-warm-refresh.txt"
p=0102-ctc-loss-refuse-empty-log-probs.patch
diff -u --label "patches/1.13.1/$p" --label "warm catalog: patches/1.13.1/$p" "$REPO/patches/1.13.1/$p" \
  "$CATALOG/patches/1.13.1/$p" > "$RUN_DIR/warm-change.diff" || true

command=(env "PATCHER_CATALOG=$CATALOG" "$PATCHER" build --torch 1.13.1 --cuda none --work "$STATE/work-warm" \
         --jobs 2 --ccache-volume "$VOLUME" --keep-build-tree --until wheel)
echo "${command[*]}" > "$STATE/warm-command.txt"
"${command[@]}" 2>&1 | tee "$RUN_DIR/steps/09-warm-build.txt"

record="$STATE/work-warm/$BUILD_ID/record.json"
$RECORD ccache-stats --volume "$VOLUME" --image "$(record_value "$record" 'r["image_tag"]')" \
  --out "$RUN_DIR/ccache-after-warm.json"
