"""The patch model: parsing, validation of trailers and diffs, the series file (no git needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patcher import patches
from patcher.errors import HostilePatchError, PatchFormatError, PatchNotFoundError

DATA = Path(__file__).parent / "data" / "broken-patches"
CATALOG = Path(__file__).resolve().parent.parent / "patches"

# file -> a phrase only that kind of damage produces
BROKEN = {
    "wrong-hunk-counts.patch": "hunk '@@ -2,9 +2,9 @@' declares 9 old / 9 new lines but has 7 / 7",
    "truncated-hunk.patch": "hunk '@@ -28,7 +28,8 @@' is truncated",
    "crlf-damage.patch": "has CRLF line endings",
    "missing-trailer.patch": "missing trailer(s) Probe",
    "invalid-category.patch": "invalid Category 'feature'",
    "invalid-patch-id.patch": "invalid Patch-Id 'PATCH-1'",
    "invalid-applies-to.patch": "invalid Applies-To '1.13.1'",
    "applies-to-mismatch.patch": "Applies-To '>=1.4,<1.6' does not include 1.13.1",
    "invalid-upstream-fix.patch": "invalid Upstream-Fix 'see the forum'",
    "unknown-probe.patch": "the probe suite does not have: maxpool2d.no_such_check",
    "invalid-upstream-tests.patch": "invalid Upstream-Tests 'test_notes.py -k \"fox or\"': -k expression 'fox or': a name is missing",
    "no-diff.patch": "contains no diff",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_kind_of_damage_has_its_own_message(name):
    with pytest.raises(PatchFormatError) as err:
        patches.parse_patch_file(DATA / name, "1.13.1")
    message = str(err.value)
    assert message.startswith(f"{name}: ")
    assert BROKEN[name] in message
    assert "\n" not in message
    others = [phrase for other, phrase in BROKEN.items() if other != name]
    assert not any(phrase in message for phrase in others)


def test_corpus_covers_every_file():
    assert {p.name for p in DATA.glob("*.patch")} == set(BROKEN) | {"good.patch", "binary-hunk.patch"}


def test_a_binary_change_is_refused_as_hostile():
    with pytest.raises(HostilePatchError) as err:
        patches.parse_patch_file(DATA / "binary-hunk.patch", "1.13.1")
    assert str(err.value).startswith("binary-hunk.patch (PT-0001): refused: logo.bin: binary change")
    assert err.value.exit_code == 34 and "\n" not in str(err.value)


def test_good_patch_fields():
    patch = patches.parse_patch_file(DATA / "good.patch", "1.13.1")
    assert patch.id == "PT-0001"
    assert patch.file == "good.patch"
    assert len(patch.sha256) == 64
    assert patch.subject == "notes: make the fox red and add a line"
    assert patch.author == "Test Author <author@patcher.invalid>"
    assert patch.date == "Fri, 2 Jan 2026 03:04:05 +0000"
    assert patch.trailers["Upstream-Bug"] == "https://github.com/pytorch/pytorch/issues/1"
    assert patch.category == "bugfix" and patch.probes == ("env.fingerprint",)
    assert patch.files == ("notes.txt",)
    (change,) = patch.changes
    assert [h.header for h in change.hunks] == ["@@ -2,7 +2,7 @@", "@@ -28,7 +28,8 @@"]
    assert change.hunks[1].new_lines[4] == "line 31b: inserted\n"
    json.dumps(patch.to_json())  # serialisable, without the text


def test_applies_to_range_containing_the_directory_version():
    text = (DATA / "good.patch").read_bytes().replace(b"Applies-To: ==1.13.1", b"Applies-To: >=1.13,<2.1")
    assert patches.parse_patch(text, "range.patch", "1.13.1").applies_to == ">=1.13,<2.1"
    with pytest.raises(PatchFormatError, match="does not include 2.1.2"):
        patches.parse_patch(text, "range.patch", "2.1.2")


def _series_dir(tmp_path: Path, files: dict[str, bytes], series: str) -> Path:
    root = tmp_path / "patches"
    directory = root / "1.13.1"
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "series").write_text(series)
    return root


def test_series_order_and_comments(tmp_path):
    good = (DATA / "good.patch").read_bytes()
    second = good.replace(b"PT-0001", b"PT-0002")
    root = _series_dir(tmp_path, {"0002-b.patch": second, "0001-a.patch": good},
                       "# header comment\n\n0002-b.patch   # trailing comment\n0001-a.patch\n")
    series = patches.load_series(root, "1.13.1")
    assert series.ids == ["PT-0002", "PT-0001"]


def test_series_names_a_missing_file(tmp_path):
    root = _series_dir(tmp_path, {"0001-a.patch": (DATA / "good.patch").read_bytes()},
                       "0001-a.patch\n0002-gone.patch\n")
    with pytest.raises(PatchNotFoundError, match="lists 0002-gone.patch, but .* does not exist"):
        patches.load_series(root, "1.13.1")


def test_series_with_duplicate_patch_id(tmp_path):
    good = (DATA / "good.patch").read_bytes()
    root = _series_dir(tmp_path, {"0001-a.patch": good, "0001-b.patch": good}, "0001-a.patch\n0001-b.patch\n")
    with pytest.raises(PatchFormatError, match="duplicate Patch-Id PT-0001: in 0001-a.patch and 0001-b.patch"):
        patches.load_series(root, "1.13.1")


def test_series_listing_a_file_twice(tmp_path):
    root = _series_dir(tmp_path, {"0001-a.patch": (DATA / "good.patch").read_bytes()},
                       "0001-a.patch\n0001-a.patch\n")
    with pytest.raises(PatchFormatError, match="lists 0001-a.patch twice"):
        patches.load_series(root, "1.13.1")


def test_no_series_for_version(tmp_path):
    with pytest.raises(PatchNotFoundError, match="no patch series for torch 9.9.9"):
        patches.load_series(tmp_path, "9.9.9")


def test_reject_happens_before_the_tree_is_touched(tmp_path, patcher_cli):
    """A malformed patch stops `check`/`apply` at loading, whatever --source is."""
    catalog = tmp_path / "catalog"
    _series_dir(catalog, {"0001-a.patch": (DATA / "truncated-hunk.patch").read_bytes()}, "0001-a.patch\n")
    source = tmp_path / "not-even-a-tree"
    result = patcher_cli("--catalog", catalog, "patches", "apply", "--torch", "1.13.1", "--source", source)
    assert result.exit_code == PatchFormatError.exit_code
    assert "is truncated" in result.stderr and "Traceback" not in result.stderr
    assert not source.exists()


# --- the real catalog ------------------------------------------------------------------------
def test_every_catalog_patch_is_valid():
    all_series = patches.list_series(CATALOG)
    assert "1.13.1" in [s.version for s in all_series]
    one13 = next(s for s in all_series if s.version == "1.13.1")
    assert "PT-0901" in one13.ids


def test_every_catalog_patch_names_upstream_tests(patcher_cli):
    """Issue 21's acceptance: `patcher patches list --json` shows Upstream-Tests for every patch."""
    result = patcher_cli("patches", "list", "--json")
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)
    assert {s["version"] for s in listed} >= {"1.4.0", "1.13.1"}
    for series in listed:
        for patch in series["patches"]:
            assert patch["trailers"].get("Upstream-Tests"), (series["version"], patch["id"])
            assert patch["upstream_tests"], (series["version"], patch["id"])


def test_upstream_tests_grammar():
    tests = patches.parse_upstream_tests('test_nn.py -k "CTCLoss or ctc_loss", '
                                         'test_jit.py::TestScript::test_calls_in_type_annotations')
    assert [str(t) for t in tests] == ['test_nn.py -k "CTCLoss or ctc_loss"',
                                       "test_jit.py::TestScript::test_calls_in_type_annotations"]
    assert tests[1].node_id == "test_jit.py::TestScript::test_calls_in_type_annotations"
    for bad, why in [("", "empty"), ("test_nn.py", "a whole file is not a selection"),
                     ('test_nn.py -k "a or"', "a name is missing"), ('test_nn.py -k "(a"', "unbalanced"),
                     ('test_nn.py -k "a; b"', "unexpected ';'"), ("../x.py::T", "not a .py file relative"),
                     ("test/test_nn.py::T", "not a .py file relative"), ("x.py::T::t;rm", "not a test or class name")]:
        with pytest.raises(ValueError, match=why):
            patches.parse_upstream_tests(bad)


def test_every_patch_names_probe_ids_that_exist():
    import patcher.probe

    known = set(patcher.probe.all_check_ids())
    assert known, "the probe registry is empty"
    assert patches.probe_check_ids() == frozenset(known)
    for series in patches.list_series(CATALOG):
        for patch in series.patches:
            missing = set(patch.probes) - known
            assert not missing, f"{series.version}/{patch.file} names unknown probe ids {missing}"


# --- commands --------------------------------------------------------------------------------
def test_list_and_show_commands(tmp_path, patcher_cli):
    catalog = tmp_path / "catalog"
    good = (DATA / "good.patch").read_bytes()
    _series_dir(catalog, {"0001-a.patch": good, "0002-b.patch": good.replace(b"PT-0001", b"PT-0002")},
                "0001-a.patch\n0002-b.patch\n")
    listed = patcher_cli("--catalog", catalog, "patches", "list", "--json")
    assert listed.exit_code == 0, listed.stderr
    (series,) = json.loads(listed.stdout)
    assert [p["id"] for p in series["patches"]] == ["PT-0001", "PT-0002"]
    assert series["patches"][0]["trailers"]["Upstream-Tests"] == "test_notes.py::TestNotes::test_fox"
    assert series["patches"][0]["upstream_tests"] == ["test_notes.py::TestNotes::test_fox"]
    table = patcher_cli("--catalog", catalog, "patches", "list", "--torch", "1.13.1")
    assert "PT-0002" in table.stdout and "notes: make the fox red" in table.stdout
    shown = patcher_cli("--catalog", catalog, "patches", "show", "PT-0002")
    assert shown.exit_code == 0
    assert "Category: bugfix" in shown.stdout and "files:   notes.txt" in shown.stdout
    assert "upstream tests (relative to the tree's test/):\n  test_notes.py::TestNotes::test_fox\n" in shown.stdout
    assert "@@ -28,7 +28,8 @@" in shown.stdout
    missing = patcher_cli("--catalog", catalog, "patches", "show", "PT-0999")
    assert missing.exit_code == PatchNotFoundError.exit_code
    assert missing.stderr.strip() == ("patcher: error: no patch PT-0999 in any series "
                                      "(`patcher patches list` shows them)")


def test_list_refuses_a_damaged_catalog(tmp_path, patcher_cli):
    catalog = tmp_path / "catalog"
    _series_dir(catalog, {}, "")
    shutil.copy(DATA / "crlf-damage.patch", catalog / "patches" / "1.13.1" / "0001-x.patch")
    (catalog / "patches" / "1.13.1" / "series").write_text("0001-x.patch\n")
    result = patcher_cli("--catalog", catalog, "patches", "list")
    assert result.exit_code == PatchFormatError.exit_code
    assert "CRLF" in result.stderr and "Traceback" not in result.stderr
