"""torch 1.4.0, the main job's release, on its real tree: the v1.4.0 tag commit fetched by `patcher
fetch` from the shallow git mirror of ../shared/sources/pytorch-git-mirror.tar (the session fixture
``real_tree_1_4_0`` of tests/fixtures/upstream_trees.py).

What is proven here: the tag is the matrix's pinned commit; every patch of the 1.4.0 series names,
in its index line, the blob the real tree holds, and the series applies exactly (no fuzz, no
offset), one commit per patch, through the real CLI; every source claim of the 1.4.0 advisory
assessments holds on the tree; no advisory is left in triage for the main job's spec.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from patcher import advisories, patches, spec
from patcher.config import DEFAULT_CATALOG, Settings
from patcher.errors import BaseImageUnavailableError
from tests.fixtures.realtree import apply_series_exactly, git

TORCH = "1.4.0"
TAG_COMMIT = "7f73f1d591afba823daa4a99a939217fb54d7688"
SERIES = ["PT-0001", "PT-0101", "PT-0102", "PT-0103", "PT-0104", "PT-0105", "PT-0110", "PT-0111"]
# advisories whose 1.4.0 state rests on claims about source (paths, text, build guards)
TREE_CLAIMS = 53


@pytest.fixture(scope="module")
def v140_clone(real_tree_1_4_0) -> Path:
    """The v1.4.0 tree `patcher fetch` made from the shallow mirror (tests/fixtures/upstream_trees.py:
    the matrix's pinned tag commit, every submodule); SHARED, read only here."""
    assert real_tree_1_4_0.commit == TAG_COMMIT
    return real_tree_1_4_0.path


@pytest.fixture
def v140_worktree(v140_clone, tmp_path) -> Path:
    """A fresh working tree of v1.4.0 for one test, which may commit freely (the series touches
    no submodule, so a shared clone of the superproject is enough)."""
    dest = tmp_path / "pytorch"
    git(tmp_path, "clone", "-q", "--shared", "--no-checkout", str(v140_clone), dest.name)
    git(dest, "checkout", "-q", "--detach", TAG_COMMIT)
    return dest


@pytest.mark.realtree
def test_the_tag_is_the_matrix_pin(v140_clone):
    assert git(v140_clone, "rev-parse", "v1.4.0^{commit}") == TAG_COMMIT
    resolved = spec.resolve(Settings(), TORCH, cuda="10.1")
    assert resolved.commit == TAG_COMMIT


@pytest.mark.realtree
def test_each_patch_is_made_against_the_real_tree(v140_worktree):
    """In series order, the index line of every diff names the blob the tree holds at that point
    (the tag, plus the earlier patches), and the patch applies with no fuzz and no offset."""
    series = patches.load_series(DEFAULT_CATALOG / "patches", TORCH)
    assert series.ids == SERIES
    for patch in series.patches:
        text = Path(patch.path).read_text()
        pairs = re.findall(r"^diff --git a/(\S+) b/\S+\nindex ([0-9a-f]{40})\.\.[0-9a-f]{40} 100644$", text, re.M)
        assert pairs, patch.id
        for rel, blob in pairs:
            assert git(v140_worktree, "rev-parse", f"HEAD:{rel}") == blob, (patch.id, rel)
        r = subprocess.run(["git", "apply", "--check", "--verbose", str(patch.path)], cwd=v140_worktree,
                           capture_output=True, text=True)
        assert r.returncode == 0, (patch.id, r.stderr)
        assert "with fuzz" not in r.stderr and "offset" not in r.stderr, (patch.id, r.stderr)
        git(v140_worktree, "am", "-q", str(patch.path))
        assert patch.applies_to == f"=={TORCH}" and patch.upstream_tests, patch.id
        # the message says where it was proven, not that the tree was out of reach
        assert "7f73f1d5" in text and "not reachable" not in text, patch.id


@pytest.mark.realtree
def test_the_series_applies_exactly_one_commit_per_patch(v140_worktree, patcher_cli):
    apply_series_exactly(patcher_cli, TORCH, v140_worktree, TAG_COMMIT, SERIES)
    assert git(v140_worktree, "status", "--porcelain") == ""
    # what the backports changed is in the tree
    mobile = (v140_worktree / "torch/csrc/jit/mobile/interpreter.cpp").read_text()
    assert mobile.count("checkTableIndex(") == 4  # the helper, OP, OPN, LOADC
    vararg = (v140_worktree / "torch/csrc/jit/vararg_functions.cpp").read_text()
    assert vararg.count("checkInputCount(") == 4  # the helper, ListConstruct(Tensor), TupleUnpack, format
    assert 'checkInputCount("TupleConstruct"' in (v140_worktree / "torch/csrc/jit/mobile/function.cpp").read_text()


@pytest.mark.realtree
def test_the_advisories_source_claims_hold_on_the_real_tree(v140_clone):
    results = advisories.check_tree(advisories.load(), TORCH, v140_clone)
    failed = [f"{r.advisory}: {r.claim}: {r.why}" for r in results if not r.ok]
    assert failed == []
    assert len(results) == TREE_CLAIMS
    # no 1.4.0 claim rests on a wheel any more
    assert all(a.assess[TORCH].wheel is None for a in advisories.load().advisories if TORCH in a.assess)


@pytest.mark.realtree
def test_a_claim_that_the_tree_contradicts_fails(v140_clone, tmp_path):
    """The check can fail: a site file claiming the RPC bindings absent is refuted by the tree."""
    site = tmp_path / "site.toml"
    site.write_text('schema = 1\n[assess."CVE-2024-48063"."1.4.0"]\nstate = "not_affected"\n'
                    'justification = "code_not_present"\ndetail = "claimed absent"\nby = "test"\n'
                    'absent = ["torch/csrc/distributed/rpc/init.cpp"]\n')
    results = advisories.check_tree(advisories.load(site=site), TORCH, v140_clone)
    wrong = [r for r in results if r.advisory == "CVE-2024-48063"]
    assert [(r.ok, r.why) for r in wrong] == [(False, "present")]


def test_no_advisory_is_in_triage_for_the_main_job(patcher_cli):
    res = patcher_cli("advisories", "--torch", TORCH, "--cuda", "10.1", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    states = {row["id"]: row["state"] for row in data["advisories"]}
    assert [i for i, s in states.items() if s == "in_triage"] == []
    rows = {row["id"]: row for row in data["advisories"]}
    for cve, patch_id in (("CVE-2024-31580", "PT-0104"), ("CVE-2024-31583", "PT-0105")):
        assert (rows[cve]["state"], rows[cve]["patch"]) == ("resolved", patch_id), rows[cve]
    # the RPC advisory follows the build flag: the official cu101 build has USE_DISTRIBUTED on
    assert states["CVE-2024-48063"] == "exploitable"
    assert states["CVE-2025-2148"] == "not_affected"


@pytest.mark.realtree
def test_the_one_kept_reference_file_is_the_tags_blob(v140_clone):
    """patches/1.4.0/.reference keeps DilatedMaxPool2d.cu for PT-0001's GPU harness only (its README
    says why); it is byte for byte the file of the real tag."""
    reference = DEFAULT_CATALOG / "patches" / TORCH / ".reference"
    kept = sorted(p.relative_to(reference).as_posix() for p in reference.rglob("*") if p.is_file())
    rel = "aten/src/ATen/native/cuda/DilatedMaxPool2d.cu"
    assert kept == ["README.md", rel]
    real = subprocess.run(["git", "show", f"{TAG_COMMIT}:{rel}"], cwd=v140_clone, capture_output=True,
                          check=True).stdout
    assert (reference / rel).read_bytes() == real


# --- the main job, as a site runs it (issue 29, item 5) ----------------------------------------------
BASE_IMAGE = ("docker.io/library/ubuntu:18.04@sha256:"
              "152dc042452c496007f07ca9127571cb9c29697f42acbfad72324b2bb2e43c98")
# what the shallow mirror does not hold: (kind, name) of `patcher mirror check`
STILL_MISSING = {
    ("file", "cuda_10.1.243_418.87.00_linux.run"), ("file", "cudnn-10.1-linux-x64-v7.6.3.30.tgz"),
    ("pip", "numpy==1.17.5"), ("pip", "PyYAML==5.4.1"), ("pip", "setuptools==44.1.1"), ("pip", "wheel==0.34.2"),
    ("image", "ubuntu-18_04"),
}


@pytest.mark.realtree
@pytest.mark.docker
def test_the_main_job_as_a_site_runs_it(real_tree_1_4_0, upstream_git_mirror, docker_client, patcher_cli, tmp_path):
    """`patcher build --torch 1.4.0 --cuda 10.1` with a config file naming the git mirror: the real tag
    commit verified, every submodule fetched, the series applied, the pinned Dockerfile rendered; then
    one line naming the first input that cannot be had here (the ubuntu:18.04 base image: no registry
    is reachable) and how a site provides it; `patcher mirror check` lists exactly what is missing."""
    assert docker_client.ping()
    work = tmp_path / "work"
    config = tmp_path / "config.toml"
    config.write_text(f'git_mirror = "file://{upstream_git_mirror}"\nwork_dir = "{work}"\n')
    # the session's patcher cache already holds every object of the mirror: no second download
    env = {"PATCHER_CONFIG": str(config), "PATCHER_CACHE_DIR": str(real_tree_1_4_0.cache_dir)}
    build = patcher_cli("build", "--torch", TORCH, "--cuda", "10.1", env=env)
    assert build.exit_code == BaseImageUnavailableError.exit_code, build.stderr
    assert "Traceback" not in build.stderr
    errors = [ln for ln in build.stderr.splitlines() if ln.startswith("patcher: error:")]
    assert len(errors) == 1 and build.stderr.rstrip("\n").endswith(errors[0]), build.stderr
    assert errors[0].startswith(f"patcher: error: the builder's base image {BASE_IMAGE} cannot be had here: "
                                "it is not in the Docker engine and pulling it failed")
    for way in ("`docker load`", "`registry` setting", "`patcher mirror sync --registry`",
                '[overrides.images] "ubuntu-18_04"',
                f"`patcher mirror check --torch {TORCH} --cuda 10.1`"):
        assert way in errors[0], way

    builds = list(work.iterdir())
    assert [b.name for b in builds] == ["torch-1.4.0-cu101.pt1-py3.7"]
    record = json.loads((builds[0] / "record.json").read_text())
    assert record["completed_stages"] == ["resolve", "fetch", "patch", "render"]
    assert record["trust_overrides"] == []  # the real tag commit: nothing overridden
    assert (record["source"]["tag"], record["source"]["commit"]) == ("v1.4.0", TAG_COMMIT)
    def flat(subs):
        return [s for sub in subs for s in (sub, *flat(sub.submodules))]

    # every submodule, nested ones included: 30 gitlinks of the superproject, 44 in all
    assert len(real_tree_1_4_0.manifest.submodules) == 30
    assert sorted(s["path"] for s in record["source"]["submodules"]) == \
        sorted(s.path for s in flat(real_tree_1_4_0.manifest.submodules))
    assert len(record["source"]["submodules"]) == 44
    assert [p["id"] for p in record["patches"]] == SERIES
    assert record["patched_tree"]["base"] == TAG_COMMIT
    dockerfile = (builds[0] / "image" / "Dockerfile").read_text()
    assert dockerfile.splitlines()[[ln.startswith("FROM ") for ln in dockerfile.splitlines()].index(True)] == \
        f"FROM {BASE_IMAGE}"
    assert "cuda_10.1.243_418.87.00_linux.run" in dockerfile

    # the site's mirror holds the git repositories only: mirror check names the rest, and only that
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "git").symlink_to(upstream_git_mirror)
    check = patcher_cli("mirror", "check", "--torch", TORCH, "--cuda", "10.1", "--from", mirror, "--json", env=env)
    assert check.exit_code == 80, check.stderr
    items = json.loads(check.stdout)["items"]
    missing = {(i["kind"], i["name"]) for i in items if i["status"] != "ok"}
    assert missing == STILL_MISSING
    git_items = [i for i in items if i["kind"] == "git"]
    assert len(git_items) == 45 and all(i["status"] == "ok" for i in git_items)


# --- the compile check of the series (issue 29, item 2) ------------------------------------------------
COMPILE_EVIDENCE = DEFAULT_CATALOG / "evidence" / "compile-check-1.4.0.json"


def test_the_recorded_compile_check_covers_every_unit_of_the_series():
    """evidence/compile-check-1.4.0.json (harness/compile_check_1_4_0/run.py on the patched real tree,
    Debian bullseye's nvcc 11.2 + g++ 10): every translation unit the series touches compiled to object
    code, PT-0001's DilatedMaxPool2d.cu in its real unit; it says which toolchain and how it differs
    from CUDA 10.1 + gcc 7."""
    from patcher import compilecheck

    record = json.loads(COMPILE_EVIDENCE.read_text())
    units, others = compilecheck.units_of_series(patches.load_series(DEFAULT_CATALOG / "patches", TORCH))
    assert sorted(u["unit"] for u in record["units"]) == sorted(u.path for u in units)
    assert sorted(record["not_compiled"]) == sorted(o["path"] for o in others)
    assert all(u["status"] == "pass" for u in record["units"]), [u["unit"] for u in record["units"]]
    assert (record["passed"], record["failed"]) == (len(units), 0)
    assert record["tree"]["tag_commit"] == TAG_COMMIT and record["tree"]["patches"] == SERIES
    maxpool = next(u for u in record["units"] if u["unit"].endswith("DilatedMaxPool2d.cu"))
    assert maxpool["compiler"] == "nvcc" and " -c /src/aten/src/ATen/native/cuda/DilatedMaxPool2d.cu " in \
        f" {maxpool['command']} "
    versions = " ".join(record["toolchain"]["versions"])
    assert "release 11.2" in versions and "g++-10" in versions
    assert any("CUDA 10.1" in d for d in record["differs_from_the_release_toolchain"])
    assert any("gcc 7" in d for d in record["differs_from_the_release_toolchain"])


NVCC_IMAGE_TAG = "patcher-test/debian:bullseye-nvcc-11.2"
NVCC_IMAGE_LABEL = "org.patcher.test-base-id"


@pytest.mark.realtree
@pytest.mark.docker
@pytest.mark.full_compile
def test_every_unit_of_the_1_4_0_series_compiles(real_tree_1_4_0, bullseye_base_image, docker_client, patcher_cli,
                                                  tmp_path):
    """The compile check that made evidence/compile-check-1.4.0.json, run again: the series applied to
    a copy of the fetched real tree, every unit compiled with bullseye's nvcc 11.2 and g++ 10 (about
    4 minutes on 2 cores, plus the image once: `make test-slow`)."""
    import shutil
    import sys

    from patcher.hostapt import host_debian_mirror
    from tests.fixtures.docker_env import build_inline, image_with_label, machine_lock

    mirror = host_debian_mirror()
    assert mirror, "no Debian mirror in this machine's apt configuration"
    with machine_lock("bullseye-nvcc"):
        if image_with_label(docker_client, NVCC_IMAGE_TAG, NVCC_IMAGE_LABEL, bullseye_base_image.image_id) is None:
            build_inline(docker_client, (
                f"FROM {bullseye_base_image.tag}\n"
                f'RUN echo "deb {mirror} bullseye main contrib non-free" > /etc/apt/sources.list \\\n'
                " && apt-get update && apt-get install -y --no-install-recommends nvidia-cuda-toolkit g++-10 g++ \\\n"
                " && rm -rf /var/lib/apt/lists/*\n"), NVCC_IMAGE_TAG, {NVCC_IMAGE_LABEL: bullseye_base_image.image_id})
    tree = tmp_path / "pytorch"
    shutil.copytree(real_tree_1_4_0.path, tree, symlinks=True)
    applied = patcher_cli("patches", "apply", "--torch", TORCH, "--source", tree)
    assert applied.exit_code == 0, applied.stderr
    from tests.conftest import CI_CACHE

    wheel_include = CI_CACHE / "legacy-torch" / "venvs" / "torch-1.4.0-py3.6" / "lib" / "python3.6" / \
        "site-packages" / "torch" / "include"
    assert (wheel_include / "ATen" / "Functions.h").is_file(), "run `make host` (.ci/fetch-legacy-wheels.sh)"
    out = tmp_path / "compile-check-1.4.0.json"
    done = subprocess.run([sys.executable, str(DEFAULT_CATALOG / "harness" / "compile_check_1_4_0" / "run.py"),
                           "--tree", str(tree), "--wheel-include", str(wheel_include), "--image", NVCC_IMAGE_TAG,
                           "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert (record["passed"], record["failed"]) == (9, 0)
    assert record["tree"]["patches"] == SERIES
    if os.environ.get("PATCHER_RECORD_COMPILE_CHECK") == "1":  # make test-slow: the committed evidence, stamped
        from patcher import slow_evidence

        stamped = slow_evidence.stamp(record, DEFAULT_CATALOG / "patches", TORCH)
        COMPILE_EVIDENCE.write_text(json.dumps(stamped, indent=2) + "\n")
