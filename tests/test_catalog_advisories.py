"""Issue 16 on the real 1.13.1 tree and Debian's real torch 1.13.1.

- every source claim of the 1.13.1 assessments (code absent, build guards) holds in the tree;
- the series, with the new backports PT-0106 to PT-0109, applies exactly and in order (git am);
- the new probe checks find each defect on Debian's unpatched python3-torch 1.13.1, and the three
  Python-level fixes (PT-0106, PT-0107, PT-0109) pass when the patched files from the real tree are
  loaded in place of the installed ones (the way tests/test_catalog_security.py proves PT-0101).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from patcher import advisories
from patcher.probe import all_check_ids

REPO_ROOT = Path(__file__).resolve().parent.parent
SERIES_DIR = REPO_ROOT / "patches" / "1.13.1"
NEW = {"PT-0106": "CVE-2025-32434", "PT-0107": "CVE-2026-24747", "PT-0108": "CVE-2025-2148",
       "PT-0109": "CVE-2025-55553"}
CHECKS = "security.cve_2025_32434,security.cve_2026_24747,security.cve_2025_2148,security.cve_2025_55553"


GIT_ENV = {"GIT_AUTHOR_NAME": "patcher test", "GIT_AUTHOR_EMAIL": "test@patcher.invalid",
           "GIT_COMMITTER_NAME": "patcher test", "GIT_COMMITTER_EMAIL": "test@patcher.invalid",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def run_git(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=dict(os.environ, **GIT_ENV))


def run_probe(python: str, only: str, out: Path, env_extra: dict | None = None) -> dict[str, dict]:
    """The real probe entry point under ``python``; its checks by id (optional checks: rc 0)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    proc = subprocess.run([python, "-m", "patcher.probe", "--only", only, "--json", str(out), "--quiet"],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {c["id"]: c for c in json.loads(out.read_text())["checks"]}


def _override_hook() -> str:
    # the meta-path hook tests/test_catalog_security.py uses for PT-0101, read from that file so
    # that both proofs load patched modules the same way
    text = (REPO_ROOT / "tests" / "test_catalog_security.py").read_text()
    return re.search(r"MODULE_OVERRIDE_SITECUSTOMIZE = '''\\\n(.*?)'''", text, re.S).group(1)


def _series() -> list[Path]:
    return [SERIES_DIR / n for n in (SERIES_DIR / "series").read_text().split() if not n.startswith("#")
            and n.endswith(".patch")]


def _patch(patch_id: str) -> Path:
    return next(p for p in _series() if re.search(rf"^Patch-Id: {patch_id}$", p.read_text(), re.M))


@pytest.mark.parametrize("patch_id", sorted(NEW))
def test_new_backports_are_catalog_patches_with_their_probe(patch_id):
    text = _patch(patch_id).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "From: patcher maintainers <maintainers@patcher.invalid>" in text
    trailers = dict(re.findall(r"^(Patch-Id|Applies-To|Category|Upstream-Bug|Upstream-Fix|Probe): (.+)$", text, re.M))
    assert trailers["Applies-To"] == "==1.13.1" and trailers["Category"] == "security"
    assert NEW[patch_id] in trailers["Upstream-Bug"]
    probe = "security." + NEW[patch_id].lower().replace("-", "_")
    assert trailers["Probe"] == probe and probe in all_check_ids()
    body = text.split("\n\n", 1)[1].split("\nPatch-Id:", 1)[0]
    for section in ("The bug.", "Who is hit.", "The fix.", "How it was proven."):
        assert section in body, section


@pytest.mark.realtree
def test_every_1_13_1_source_claim_holds_in_the_real_tree(realtree_checkout):
    results = advisories.check_tree(advisories.load(), "1.13.1", realtree_checkout)
    assert len(results) >= 30
    failed = [r for r in results if not r.ok]
    assert not failed, failed


@pytest.fixture
def patched_tree(realtree_checkout) -> Path:
    """The real tree with the whole 1.13.1 series applied in order, as the pipeline does (git am)."""
    for path in _series():
        r = run_git(realtree_checkout, "am", "-q", "--committer-date-is-author-date", str(path))
        assert r.returncode == 0, (path.name, r.stderr)
    return realtree_checkout


@pytest.mark.realtree
def test_the_series_with_the_backports_applies_exactly_in_order(patched_tree):
    # oldest first: the four backports, one commit each, in series order (PT-0109 came last)
    log = run_git(patched_tree, "log", "--reverse", "--format=%s").stdout.splitlines()
    backports = [s for s in log if s.startswith(("serialization: weights_only=True", "weights_only: SETITEM",
                                                 "jit: refuse None", "fx: never write a Python keyword"))]
    assert [s.split(":")[0] for s in backports] == ["serialization", "weights_only", "jit", "fx"], backports
    text = (patched_tree / "torch" / "serialization.py").read_text()
    assert "Weights only load refused: this file is a TorchScript archive" in text
    assert "declares {numel} bytes, but its record in the archive holds" in text
    assert "_check_setitem_target" in (patched_tree / "torch" / "_weights_only_unpickler.py").read_text()
    assert "py::isinstance<PythonFutureWrapper>(obj)" in (
        patched_tree / "torch" / "csrc" / "jit" / "python" / "pybind_utils.cpp").read_text()
    assert "return name.isidentifier() and not keyword.iskeyword(name)" in (
        patched_tree / "torch" / "fx" / "graph.py").read_text()


@pytest.mark.realtree
def test_backports_proven_on_debian_torch(patched_tree, system_torch_python, tmp_path):
    stock = run_probe(system_torch_python, CHECKS, tmp_path / "stock.json")
    load = stock["security.cve_2025_32434"]
    assert load["status"] == "fail" and "wrote the probe's marker file" in load["message"], load
    unpickler = stock["security.cve_2026_24747"]
    assert unpickler["status"] == "fail", unpickler
    assert unpickler["details"]["oversized storage"].startswith("loaded: a 262144-byte storage")
    assert unpickler["details"]["SETITEM on a tensor"] == "loaded: element 0 is 7.0"
    assert stock["security.cve_2025_2148"]["status"] == "fail"
    assert stock["security.cve_2025_2148"]["message"].startswith("killed by SIG"), stock["security.cve_2025_2148"]
    fx = stock["security.cve_2025_55553"]
    assert fx["status"] == "fail" and fx["finding"] and "SyntaxError (CVE-2025-55553)" in fx["message"], fx
    assert fx["details"]["random_(3, 7) under make_fx"] == (
        "SyntaxError: invalid syntax: random_ = torch.ops.aten.random_.from(clone, 3, 7);  clone = None")
    assert fx["details"]["uniform_(**{'from': 2.0, 'to': 3.0}) under fx.symbolic_trace"].startswith(
        "SyntaxError: invalid syntax: uniform_ = x.uniform_(from = 2.0")
    assert fx["details"]["routes"] == {"an operator overload named 'from' (aten::random_.from, make_fx)": "found",
                                       "a keyword argument named 'from' (fx.symbolic_trace)": "found"}

    hook = tmp_path / "override"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_override_hook())
    serialization = patched_tree / "torch" / "serialization.py"
    unpickler_file = patched_tree / "torch" / "_weights_only_unpickler.py"
    fx_graph = patched_tree / "torch" / "fx" / "graph.py"
    env = {"PYTHONPATH": str(hook), "PATCHER_MODULE_OVERRIDES":
           f"torch.serialization={serialization};torch._weights_only_unpickler={unpickler_file};"
           f"torch.fx.graph={fx_graph}"}
    patched = run_probe(system_torch_python, "security.cve_2025_32434,security.cve_2026_24747,security.cve_2025_55553",
                        tmp_path / "patched.json", env)
    load = patched["security.cve_2025_32434"]
    assert load["status"] == "pass", load
    assert load["details"]["module_file"] == {"torch.serialization": str(serialization)}
    assert load["details"]["result"].startswith("refused: UnpicklingError: Weights only load refused")
    unpickler = patched["security.cve_2026_24747"]
    assert unpickler["status"] == "pass", unpickler
    assert unpickler["details"]["module_file"]["torch._weights_only_unpickler"] == str(unpickler_file)
    assert "declares 262144 bytes, but its record in the archive holds 16" in unpickler["details"]["oversized storage"]
    assert "Can only set items of dict objects" in unpickler["details"]["SETITEM on a tensor"]
    fx = patched["security.cve_2025_55553"]
    assert fx["status"] == "pass", fx
    assert fx["details"]["module_file"] == {"torch.fx.graph": str(fx_graph)}
    assert fx["details"]["random_(3, 7) under make_fx"] == "compiled; 256 draws in 3..6"
    assert fx["details"]["uniform_(**{'from': 2.0, 'to': 3.0}) under fx.symbolic_trace"] == (
        "compiled; 256 draws in [2, 3]")
    assert fx["details"]["routes"] == {"an operator overload named 'from' (aten::random_.from, make_fx)": "not found",
                                       "a keyword argument named 'from' (fx.symbolic_trace)": "not found"}
