"""The probe package runs inside old interpreters: Python 3.6 grammar, standard library + torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROBE_DIR = Path(__file__).resolve().parent.parent / "patcher" / "probe"
PROBE_FILES = sorted(PROBE_DIR.rglob("*.py"))
STDLIB = set(sys.stdlib_module_names)
NEWER_THAN_36 = {"dataclasses", "contextvars", "zoneinfo", "graphlib", "tomllib"}
SELF_DOCUMENTING = re.compile(r"\{[^{}!:]*[^{}!:=<>]=\s*(![rsa])?(:[^{}]*)?\}")


def test_there_are_probe_files():
    names = {p.relative_to(PROBE_DIR).as_posix() for p in PROBE_FILES}
    assert {"__init__.py", "__main__.py", "framework.py", "report.py", "checks/env.py", "checks/maxpool.py",
            "checks/determinism.py", "checks/security.py"} <= names


@pytest.mark.parametrize("path", PROBE_FILES, ids=lambda p: p.relative_to(PROBE_DIR).as_posix())
def test_python36_grammar(path):
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path), feature_version=(3, 6))
    # what the 3.6 grammar check lets through: newer features that parse anyway
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        assert not isinstance(node, ast.NamedExpr), f"{where}: walrus (3.8)"
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            assert all(a.name != "annotations" for a in node.names), f"{where}: future annotations (3.7)"
        if isinstance(node, ast.keyword) and node.arg in ("capture_output", "text"):
            raise AssertionError(f"{where}: subprocess {node.arg}= (3.7)")
        if isinstance(node, ast.JoinedStr):
            segment = ast.get_source_segment(source, node) or ""
            assert not SELF_DOCUMENTING.search(segment), f"{where}: f-string '=' (3.8)"


@pytest.mark.parametrize("path", PROBE_FILES, ids=lambda p: p.relative_to(PROBE_DIR).as_posix())
def test_imports_only_stdlib_torch_and_itself(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the probe package
                continue
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        for root in roots:
            assert root in STDLIB or root == "torch", f"{path}:{node.lineno}: imports {root}"
            assert root not in NEWER_THAN_36, f"{path}:{node.lineno}: {root} is newer than Python 3.6"


def test_vermin_minimum_version_is_at_most_36():
    vermin = Path(sys.executable).parent / "vermin"
    proc = subprocess.run([str(vermin), "--no-tips", "--no-parse-comments", "-vv", str(PROBE_DIR)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"Minimum required versions:\s*(?:~2\.\d+, )?(\d+)\.(\d+)", proc.stdout)
    assert match, proc.stdout[-2000:]
    assert (int(match.group(1)), int(match.group(2))) <= (3, 6), proc.stdout[-3000:]
    # and the direct question: no 3.7+ feature anywhere
    strict = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.6-", str(PROBE_DIR)],
                            capture_output=True, text=True)
    assert strict.returncode == 0, strict.stdout + strict.stderr
