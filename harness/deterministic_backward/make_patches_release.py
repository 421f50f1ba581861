#!/usr/bin/env python3
"""Make PT-0201 and PT-0202 for another release from det_kernels.cuh, like make_patches.py.

The kernels, the wiring and the update of upstream's test_nondeterministic_alert_* tests are
make_patches.py's own transforms, applied to the release's AdaptiveMaxPooling2d.cu,
GridSampler.cu and test/test_torch.py (they refuse to run where an anchor they need is
missing). Both patches touch test_torch.py, so PT-0202 is made on top of PT-0201, in series
order. Only the trailers and the paragraph that says how far the port is proven differ per
release.

    python3 harness/deterministic_backward/make_patches_release.py \
        --release 2.6.0 --tree /tmp/pytorch-2.6.0 --out patches/2.6.0

--tree is the release's pristine tree (left untouched; it is copied).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches as base  # noqa: E402
from make_patches_common import commit_patch, scratch_repo  # noqa: E402

# What is true of each port beyond the 1.13.1 proof the messages carry.
PORT_NOTES = {
    "2.6.0": (
        "The port to 2.6.0. The 2.6.0 files have the code the wiring hooks into\n"
        "unchanged from 1.13.1 (the same alertNotDeterministic call sites, the same\n"
        "atomic kernels and launch code), so the same sections are inserted at the\n"
        "same places. The patch applies exactly to Debian's real 2.6.0 tree (CI);\n"
        "whether it compiles in a 2.6.0 build is for `patcher check --compile` with\n"
        "nvcc 12.4 to show, and it has not run on a 2.6.0 GPU.\n"
    ),
}


# Where the release keeps a test file the 1.13.1 trailers name elsewhere (2.x moved the pooling
# tests out of test_nn.py); checked against the real tree by tests/test_realtree_2_6_0.py.
MOVED_TESTS = {
    "2.6.0": {'Upstream-Tests: test_nn.py -k "AdaptiveMaxPool2d':
              'Upstream-Tests: nn/test_pooling.py -k "AdaptiveMaxPool2d'},
}


def for_release(message, release):
    """The 1.13.1 message with the release's Applies-To, its test files and its port note before the trailers."""
    body, trailers = message.split("\nPatch-Id: ", 1)
    trailers = "Patch-Id: " + trailers.replace("Applies-To: ==1.13.1", f"Applies-To: =={release}")
    for old, new in MOVED_TESTS.get(release, {}).items():
        trailers = trailers.replace(old, new)
    return body + "\n" + PORT_NOTES[release] + "\n" + trailers


PATCHES = (
    ("0201-deterministic-adaptive-max-pool2d-backward.patch", base.AMP_MESSAGE,
     {base.AMP_FILE: base.patch_amp,
      base.TEST_TORCH: lambda src: base.expect_no_cuda_alert(src, "AdaptiveMaxPool2d", "PT-0201")}),
    ("0202-deterministic-grid-sampler-2d-backward.patch", base.GS_MESSAGE,
     {base.GS_FILE: base.patch_gs,
      base.TEST_TORCH: lambda src: base.expect_no_cuda_alert(src, "grid_sample_2d", "PT-0202")}),
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, choices=sorted(PORT_NOTES))
    ap.add_argument("--tree", required=True, help="the release's pristine tree")
    ap.add_argument("--out", required=True, help="patches/<release> directory")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="detbw-patches-", dir="/tmp") as scratch:
        repo = scratch_repo(tree, scratch, label=f"pristine {args.release}")
        for name, message, transforms in PATCHES:  # in series order, each on top of the last
            commit_patch(repo, scratch, transforms, for_release(message, args.release),
                         os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
