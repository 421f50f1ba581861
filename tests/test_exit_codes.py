"""Exit codes are an interface: each error class has its own, and README's table lists them all."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import patcher.errors as errors

README = Path(__file__).resolve().parent.parent / "README.md"


def _error_classes() -> dict[str, int]:
    return {name: cls.exit_code for name, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.PatcherError)}


def test_every_error_class_has_a_code_of_its_own():
    by_code: dict[int, list[str]] = {}
    for name, code in _error_classes().items():
        by_code.setdefault(code, []).append(name)
    shared = {code: names for code, names in by_code.items() if len(names) > 1}
    assert not shared, shared


def test_readme_lists_every_exit_code():
    listed = {name: int(code) for code, name in
              re.findall(r"^\| (\d+) \| `(\w+)` \|", README.read_text(encoding="utf-8"), flags=re.M)}
    assert listed == _error_classes()
