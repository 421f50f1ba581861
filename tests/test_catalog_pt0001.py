"""PT-0001 (torch 1.4.0 max_pool2d channels-last shared memory): the catalog entry holds up.

No GPU needed: the patch applies exactly to the kept v1.4.0 file (real git; that it is the real
tag's blob is tests/test_realtree_1_4_0.py's), the
patched file reads cudaGetLastError() once per check and names the right function,
and the committed GPU evidence covers exactly this patched file and says all passed.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PATCH_DIR = REPO / "patches" / "1.4.0"
PATCH_NAME = "0001-max-pool2d-nhwc-shared-memory.patch"
PATCH = PATCH_DIR / PATCH_NAME
REL = "aten/src/ATen/native/cuda/DilatedMaxPool2d.cu"
REFERENCE = PATCH_DIR / ".reference" / REL
EVIDENCE = REPO / "evidence" / "gpu" / "pt0001-maxpool-nhwc.json"
HARNESS = REPO / "harness" / "pt0001_maxpool_nhwc"

# the blob at the v1.4.0 tag commit (first read at pytorch master 66cb93c7627385a1e3272e32586ea1baace17d59,
# see patches/1.4.0/.reference/README.md)
REFERENCE_GIT_BLOB = "1f565961fba7e85fcaffff2cdc56649c6bf25e3d"
REFERENCE_SHA256 = "4f793d3477537c8fbb9868bb771832a1b67662f0c683288728b4186546eee3e1"

TRAILERS = {
    "Patch-Id": "PT-0001",
    "Applies-To": "==1.4.0",
    "Category": "bugfix",
    "Upstream-Bug": "https://github.com/pytorch/pytorch/issues/33988, "
                    "https://github.com/pytorch/pytorch/issues/34083, "
                    "https://github.com/pytorch/pytorch/issues/34450",
    "Upstream-Fix": "https://github.com/pytorch/pytorch/pull/34519",
    "Probe": "maxpool2d.nhwc_large_channels, maxpool2d.error_message",
    "Upstream-Tests": 'test_nn.py -k "max_pool2d_nhwc or MaxPool2d_indices or max_pool_nan"',
}

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def git(cwd, *args, stdin=None):
    import os
    env = dict(os.environ)
    env.update(GIT_ENV)
    return subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True)


@pytest.fixture
def reference_repo(tmp_path):
    """A real git repository holding the vendored v1.4.0 file at its tree path."""
    repo = tmp_path / "tree"
    dest = repo / REL
    dest.parent.mkdir(parents=True)
    dest.write_bytes(REFERENCE.read_bytes())
    assert git(repo, "init", "-q").returncode == 0
    assert git(repo, "add", ".").returncode == 0
    assert git(repo, "commit", "-q", "-m", "v1.4.0 reference").returncode == 0
    return repo


@pytest.fixture
def patched_text(reference_repo):
    r = git(reference_repo, "apply", PATCH.as_posix())
    assert r.returncode == 0, r.stderr
    return (reference_repo / REL).read_text()


def _function(text, name, until):
    start = text.index(name)
    return text[start:text.index(until, start + len(name))]


def test_series_lists_the_patch():
    lines = [ln.strip() for ln in (PATCH_DIR / "series").read_text().splitlines()]
    assert PATCH_NAME in lines
    assert PATCH.is_file()


def test_reference_is_the_recorded_upstream_blob(reference_repo):
    data = REFERENCE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == REFERENCE_SHA256
    blob = git(reference_repo, "hash-object", REL)
    assert blob.stdout.strip() == REFERENCE_GIT_BLOB
    assert "commit" in (PATCH_DIR / ".reference" / "README.md").read_text()


def test_patch_applies_exactly_without_offset_or_fuzz(reference_repo):
    r = git(reference_repo, "apply", "--check", "--verbose", PATCH.as_posix())
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "offset" not in out and "fuzz" not in out.lower(), out
    # and as a mailbox, the way patcher applies a series
    r = git(reference_repo, "am", "-q", PATCH.as_posix())
    assert r.returncode == 0, r.stderr
    # the author and date of the patch are kept (the committer is whoever applies it)
    log = git(reference_repo, "log", "-1", "--format=%an <%ae>%n%aI")
    assert log.stdout.splitlines() == ["patcher maintainers <maintainers@patcher.invalid>",
                                       "2026-11-30T00:00:00Z"]


def test_mbox_header_and_trailers(reference_repo):
    text = PATCH.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40} 100644$", text, re.M)
    assert not re.search(r"^-- \n", text, re.M), "signature must be off"
    message = text.split("\n---\n", 1)[0]
    parsed = git(reference_repo, "interpret-trailers", "--parse", stdin=message + "\n")
    got = dict(line.split(": ", 1) for line in parsed.stdout.splitlines() if line)
    assert got == TRAILERS
    body = message.lower()
    for needed in ("root cause", "error code 0", "48 kib", "c >= 193", "c >= 257", "c >= 129",
                   "66cb93c7627385a1e3272e32586ea1baace17d59",
                   # proven on the real v1.4.0 tree (tests/test_realtree_1_4_0.py)
                   "7f73f1d591afba823daa4a99a939217fb54d7688", REFERENCE_GIT_BLOB):
        assert needed in body, needed


def test_patched_checks_read_the_error_once(patched_text):
    sys.path.insert(0, str(HARNESS))
    try:
        from extract import check_statements
    finally:
        sys.path.remove(str(HARNESS))
    # the bug being fixed: the reference has it twice in one check
    reference = REFERENCE.read_text()
    assert any(s.count("cudaGetLastError()") == 2 for s in check_statements(reference))
    for stmt in check_statements(patched_text):
        assert stmt.count("cudaGetLastError()") == 0, stmt
    assert "cudaGetLastError() == cudaSuccess" not in patched_text
    reads = [ln for ln in patched_text.splitlines() if "cudaGetLastError()" in ln
             and not ln.strip().startswith("//")]
    assert len(reads) == 2, reads  # one read in forward, one in backward
    assert patched_text.count("cudaGetErrorString(launch_err)") == 2


def test_backward_message_names_the_backward_function(patched_text):
    bwd = _function(patched_text, "void max_pool2d_with_indices_backward_out_cuda_template(",
                    "} // namespace")
    assert '"max_pool2d_with_indices_backward_out_cuda_frame failed with error code "' in bwd
    assert "fractional_max_pool2d" not in patched_text
    fwd = _function(patched_text, "void max_pool2d_with_indices_out_cuda_template(",
                    "void max_pool2d_with_indices_backward_out_cuda_template(")
    assert '"max_pool2d_with_indices_out_cuda_frame failed with error code "' in fwd


def test_nhwc_launches_bound_their_shared_memory(patched_text):
    assert "nInputPlane * block_y * block_z" not in patched_text
    assert patched_text.count("<<<grid, block, smem_size,") == 2
    assert patched_text.count("TORCH_INTERNAL_ASSERT(smem_size <= smem_limit,") == 2
    assert patched_text.count("sharedMemPerBlock") == 2


def test_harness_extracts_both_files(patched_text):
    sys.path.insert(0, str(HARNESS))
    try:
        from extract import extract
    finally:
        sys.path.remove(str(HARNESS))
    for text in (REFERENCE.read_text(), patched_text):
        seg = extract(text)
        assert "__global__ void max_pool_forward_nhwc" in seg["prelude"]
        assert "__global__ void max_pool_backward_nhwc" in seg["prelude"]
        assert "max_pool_forward_nhwc<scalar_t, scalar_t>" in seg["fwd_case"]
        assert "max_pool_backward_nhwc<scalar_t, accscalar_t>" in seg["bwd_case"]
        assert "cudaGetLastError()" in seg["fwd_check"] and "cudaGetLastError()" in seg["bwd_check"]


def test_gpu_evidence_covers_this_patch_and_passed(patched_text):
    ev = json.loads(EVIDENCE.read_text())
    assert ev["patch_id"] == "PT-0001" and ev["torch_target"] == "1.4.0"
    assert "fatal" not in ev
    assert ev["all_passed"] is True
    src = ev["sources"]
    assert src["reference_sha256"] == REFERENCE_SHA256
    assert src["patched_sha256"] == hashlib.sha256(patched_text.encode()).hexdigest()
    assert ev["error_read_twice"]["first_read"] != 0 and ev["error_read_twice"]["second_read"] == 0
    cases = ev["cases"]
    assert cases and all(c["passed"] for c in cases)
    assert ev["summary"]["failed"] == 0 and ev["summary"]["passed"] == len(cases)
    seen = {(c["dtype"], tuple(c["shape"])) for c in cases}
    assert ("float16", (200, 512, 28, 28)) in seen
    for dtype, cs in {"float64": (128, 129), "float32": (192, 193), "float16": (256, 257)}.items():
        for c in cs + (1024, 2048, 4096):
            assert (dtype, (8, c, 28, 28)) in seen, (dtype, c)
    for c in cases:
        assert c["patched"]["forward_max_abs_err"] == 0.0 and c["patched"]["indices_equal"]
    # the unpatched 1.4 configuration fails past the thresholds, and reads as "error code 0"
    flagship = next(c for c in cases if c["shape"] == [200, 512, 28, 28])
    u = flagship["unpatched"]
    assert u["forward_launch"]["first_read"] != 0 and u["forward_launch"]["second_read"] == 0
    assert u["forward_1_4_message"].endswith("failed with error code 0")
    assert "invalid argument" in u["forward_patched_message"]
    assert ev["summary"]["unpatched_forward_launch_failures"] > 0
    assert ev["summary"]["unpatched_backward_launch_failures"] > 0
    bwd_fail = [c for c in cases if c.get("unpatched", {}).get("backward_launch", {})
                .get("first_read")]
    assert bwd_fail and all("max_pool2d_with_indices_backward_out_cuda_frame"
                            in c["unpatched"]["backward_patched_message"] for c in bwd_fail)
    assert (HARNESS / "README.md").read_text().count("run.py") >= 1
