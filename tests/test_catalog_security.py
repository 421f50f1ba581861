"""Security backports PT-0101..PT-0105 (issue 4, part 2) and the catalog table in patches/README.md.

What is proven here, with real inputs:
- every security patch is a well-formed mbox with our trailers, names probe ids that exist, and
  explains the bug and the fix in its body;
- each 1.13.1 patch applies exactly to Debian's real 1.13.1 tree (the 1.4.0 series is proven on
  the real v1.4.0 tree in tests/test_realtree_1_4_0.py);
- the Python-level fix (PT-0101) on Debian's python3-torch 1.13.1: the probe's bypass check
  fails against the installed ``torch/jit/annotations.py`` and both CVE-2022-45907 checks pass
  when the patched file from the real tree is loaded in its place;
- the C++ defects are found on the unpatched Debian torch: mkldnn_max_pool2d with stride 0
  kills the probe's child with SIGFPE, malformed mobile bytecode kills it with a signal.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from patcher import patches
from patcher.probe import all_check_ids, describe_checks
from patcher.probe.checks import security
from patcher.probe.framework import Skip

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES = REPO_ROOT / "patches"

SECURITY_IDS = {
    "1.13.1": ["PT-0101", "PT-0102", "PT-0103", "PT-0104", "PT-0105"],
    "1.4.0": ["PT-0101", "PT-0102", "PT-0103", "PT-0104", "PT-0105"],
}
CVES = {
    "PT-0101": "CVE-2022-45907",
    "PT-0102": "CVE-2025-3730",
    "PT-0103": "CVE-2025-2953",
    "PT-0104": "CVE-2024-31580",
    "PT-0105": "CVE-2024-31583",
}
TRAILER_KEYS = ["Patch-Id", "Applies-To", "Category", "Upstream-Bug", "Upstream-Fix", "Probe", "Upstream-Tests"]

# Loads patched copies of torch's pure-Python modules in place of the installed ones, in this
# interpreter and in every child it starts (isolated probe checks): a sitecustomize on
# PYTHONPATH adds a meta-path finder for the modules named in PATCHER_MODULE_OVERRIDES
# ("dotted.name=/path/file.py;..."). The installed torch is not touched.
MODULE_OVERRIDE_SITECUSTOMIZE = '''\
import importlib.abc
import importlib.util
import os
import sys


class PatchedModuleFinder(importlib.abc.MetaPathFinder):
    def __init__(self, overrides):
        self.overrides = overrides

    def find_spec(self, fullname, path=None, target=None):
        location = self.overrides.get(fullname)
        if location is None:
            return None
        return importlib.util.spec_from_file_location(fullname, location)


overrides = dict(item.split("=", 1) for item in os.environ.get("PATCHER_MODULE_OVERRIDES", "").split(";")
                 if "=" in item)
if overrides:
    sys.meta_path.insert(0, PatchedModuleFinder(overrides))
'''


def security_patches():
    for version, ids in SECURITY_IDS.items():
        series = patches.load_series(PATCHES, version)
        by_id = {p.id: p for p in series.patches}
        for patch_id in ids:
            yield pytest.param(version, by_id[patch_id], id=f"{version}-{patch_id}")


GIT_IDENTITY = {"GIT_AUTHOR_NAME": "patcher test", "GIT_AUTHOR_EMAIL": "test@patcher.invalid",
                "GIT_COMMITTER_NAME": "patcher test", "GIT_COMMITTER_EMAIL": "test@patcher.invalid"}


def run_git(cwd, *args, stdin=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **GIT_IDENTITY)
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, input=stdin, env=env)


def run_probe(python: str, only: str, out: Path, env_extra: dict | None = None) -> dict[str, dict]:
    """The real probe entry point under ``python``; returns its checks by id."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    proc = subprocess.run([python, "-m", "patcher.probe", "--only", only, "--json", str(out), "--quiet"],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr  # these checks are optional: findings do not fail the run
    return {c["id"]: c for c in json.loads(out.read_text())["checks"]}


# --- the patches as catalog entries --------------------------------------------------------
@pytest.mark.parametrize(("version", "patch"), list(security_patches()))
def test_trailers_probe_ids_and_body(version, patch):
    assert patch.author == "patcher maintainers <maintainers@patcher.invalid>"
    assert patch.date == "Mon, 30 Nov 2026 00:00:00 +0000"
    assert patch.trailers["Applies-To"] == f"=={version}"
    assert patch.category == "security"
    cve = CVES[patch.id]
    assert patch.trailers["Upstream-Bug"].split(", ")[0] == f"https://nvd.nist.gov/vuln/detail/{cve}"
    assert re.match(r"^https://github\.com/pytorch/pytorch/pull/\d+$", patch.trailers["Upstream-Fix"])
    known = set(all_check_ids())
    assert patch.probes and set(patch.probes) <= known, set(patch.probes) - known
    assert all(probe.startswith("security.") for probe in patch.probes)

    # the message ends with exactly our trailers, in order; the body explains in our words
    message = patch.text.split("\n\n", 1)[1].split("\n---\n", 1)[0].rstrip("\n")
    tail = message.rsplit("\n\n", 1)[1].splitlines()
    assert [line.split(":", 1)[0] for line in tail if not line.startswith((" ", "\t"))] == TRAILER_KEYS
    body = message.rsplit("\n\n", 1)[0]
    for section in ("The bug.", "Who is hit.", "The fix.", "How it was proven."):
        assert section in body, section
    assert len(body.split()) > 150


def test_probe_checks_are_registered_with_their_patches():
    described = {d["id"]: d for d in describe_checks()}
    for patch_id, cve in CVES.items():
        check_id = "security." + cve.lower().replace("-", "_")
        assert patch_id in described[check_id]["patches"], check_id
        # optional on a stock wheel, required when the wheel carries the patch
        assert described[check_id]["required"] is False
    assert described["security.cve_2022_45907_bypass"]["patches"] == ["PT-0101"]
    for crashing in ("security.cve_2025_3730", "security.cve_2025_2953", "security.cve_2024_31580",
                     "security.cve_2024_31583"):
        assert described[crashing]["isolate"] is True


@pytest.mark.parametrize("version", sorted(SECURITY_IDS))
def test_series_lists_the_security_patches_in_id_order(version):
    files = patches.read_series_file(PATCHES / version)
    ids = [patches.parse_patch_file(PATCHES / version / name, version).id for name in files]
    ours = [i for i in ids if i in SECURITY_IDS[version]]
    assert ours == SECURITY_IDS[version]
    if version == "1.4.0":
        assert ids[0] == "PT-0001"


# --- applying ----------------------------------------------------------------------------------
@pytest.mark.realtree
def test_each_1_13_1_patch_applies_to_the_real_tree(realtree_checkout):
    series = patches.load_series(PATCHES, "1.13.1")
    by_id = {p.id: p for p in series.patches}
    for patch_id in SECURITY_IDS["1.13.1"]:
        r = run_git(realtree_checkout, "apply", "--check", "--verbose", by_id[patch_id].path)
        assert r.returncode == 0, (patch_id, r.stderr)
        assert "with fuzz" not in r.stderr and "offset" not in r.stderr


# --- proof on a real torch -----------------------------------------------------------------------
@pytest.fixture
def patched_annotations(realtree_checkout) -> Path:
    """The real tree's torch/jit/annotations.py with PT-0101 applied (git am, as the pipeline does)."""
    patch = next(p for p in patches.load_series(PATCHES, "1.13.1").patches if p.id == "PT-0101")
    r = run_git(realtree_checkout, "am", "-q", "--committer-date-is-author-date", patch.path)
    assert r.returncode == 0, r.stderr
    path = realtree_checkout / "torch" / "jit" / "annotations.py"
    assert "_check_type_expression" in path.read_text()
    return path


@pytest.mark.realtree
def test_pt0101_proven_on_debian_torch(patched_annotations, system_torch_python, tmp_path):
    only = "security.cve_2022_45907,security.cve_2022_45907_bypass"
    stock = run_probe(system_torch_python, only, tmp_path / "stock.json")
    assert stock["security.cve_2022_45907"]["status"] == "pass"  # 1.13.1 has upstream's fix
    bypass = stock["security.cve_2022_45907_bypass"]
    assert bypass["status"] == "fail" and bypass["finding"], bypass
    assert bypass["details"]["shapes"]["comparison on a resolved object"]["result"].startswith("evaluated")
    assert bypass["details"]["module_file"].startswith("/usr/lib/python3/dist-packages/torch/")

    hook = tmp_path / "override"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(MODULE_OVERRIDE_SITECUSTOMIZE)
    env = {"PYTHONPATH": str(hook), "PATCHER_MODULE_OVERRIDES": f"torch.jit.annotations={patched_annotations}"}
    patched = run_probe(system_torch_python, only, tmp_path / "patched.json", env)
    for check_id in only.split(","):
        entry = patched[check_id]
        assert entry["status"] == "pass", entry
        assert entry["details"]["module_file"] == str(patched_annotations)
    shapes = patched["security.cve_2022_45907_bypass"]["details"]["shapes"]
    assert all("is not a type expression" in s["result"] for s in shapes.values()), shapes


@pytest.mark.realtree
def test_unpatched_debian_torch_findings(system_torch_python, tmp_path):
    checks = run_probe(system_torch_python, "security", tmp_path / "stock.json")
    assert set(checks) == {i for i in all_check_ids() if i.startswith("security.")}
    mkldnn = checks["security.cve_2025_2953"]
    assert mkldnn["status"] == "fail" and "SIGFPE" in mkldnn["message"], mkldnn
    for check_id in ("security.cve_2024_31580", "security.cve_2024_31583"):
        entry = checks[check_id]
        # reading past the stack or the operator table: a signal, or a finding with the symptom
        assert entry["status"] == "fail", entry
        assert entry["finding"] or entry["message"].startswith("killed by SIG"), entry
    # the CPU ctc_loss kernel never crashed; the CVE-2025-3730 crash is in the CUDA kernel
    ctc = checks["security.cve_2025_3730"]
    assert ctc["status"] == "pass" and ctc["details"]["devices"] == ["cpu"], ctc


# --- the bytecode rewriting the mobile checks use (pure logic) -------------------------------------
def _toy_model(instructions) -> bytes:
    bytecode = (8, ("__torch__.M.forward", (("instructions", instructions),
                                            ("operators", (("aten::add", "int", 2),)),
                                            ("constants", (1,)), ("types", ()), ("register_size", 2)),
                    (("arguments", ()), ("returns", ()))))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02N.")
        archive.writestr("archive/bytecode.pkl", pickle.dumps(bytecode, protocol=2))
    return out.getvalue()


def test_bytecode_rewrite_changes_only_the_chosen_operand():
    model = _toy_model((("LOADC", 0, 0), ("OP", 0, 0), ("TUPLE_CONSTRUCT", 2, 0), ("RET", 0, 0)))

    def point_op_elsewhere(ins):
        return (ins[0], 7, ins[2]) if ins[0] == "OP" else ins

    rewritten = zipfile.ZipFile(io.BytesIO(security._with_bytecode(model, point_op_elsewhere)))
    assert rewritten.namelist() == ["archive/data.pkl", "archive/bytecode.pkl"]
    assert rewritten.read("archive/data.pkl") == b"\x80\x02N."
    code = dict(pickle.loads(rewritten.read("archive/bytecode.pkl"))[1][1])
    assert code["instructions"] == (("LOADC", 0, 0), ("OP", 7, 0), ("TUPLE_CONSTRUCT", 2, 0), ("RET", 0, 0))
    assert code["operators"] == (("aten::add", "int", 2),)


def test_bytecode_rewrite_skips_an_archive_without_bytecode():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02N.")
    with pytest.raises(Skip, match="no bytecode.pkl"):
        security._with_bytecode(out.getvalue(), lambda ins: ins)


# --- the catalog table -----------------------------------------------------------------------------
def test_readme_table_lists_every_patch_of_every_series():
    rows = set()
    for line in (PATCHES / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| PT-") and len(cells) == 10:
            rows.add((cells[0], cells[1]))
    listed = set()
    for series in patches.list_series(PATCHES):
        for patch in series.patches:
            listed.add((patch.id, series.version))
    assert listed, "no series found"
    assert listed <= rows, sorted(listed - rows)
    assert rows <= listed, sorted(rows - listed)  # no stale rows either
