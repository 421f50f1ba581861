"""check / apply / new / refresh on small real git repositories built here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from patcher import patches
from patcher.errors import DirtyTreeError, PatchApplyError, PatchFormatError, PatchNotFoundError
from patcher.source import tree_hash

VERSION = "1.13.1"
TRAILERS = """
Patch-Id: {id}
Applies-To: =={version}
Category: bugfix
Upstream-Bug: none
Upstream-Fix: none
Probe: env.fingerprint
Upstream-Tests: test_notes.py -k "fox"
"""


def git(cwd, *args, env=None) -> str:
    full = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
                GIT_AUTHOR_NAME="Base", GIT_AUTHOR_EMAIL="base@patcher.invalid",
                GIT_COMMITTER_NAME="Base", GIT_COMMITTER_EMAIL="base@patcher.invalid",
                GIT_AUTHOR_DATE="2025-01-01T00:00:00+00:00", GIT_COMMITTER_DATE="2025-01-01T00:00:00+00:00")
    full.update(env or {})
    proc = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout.strip()


def edit(path: Path, index: int, new: str | None = None, insert: str | None = None) -> None:
    lines = path.read_text().split("\n")
    if insert is not None:
        lines.insert(index, insert)
    else:
        lines[index] = new
    path.write_text("\n".join(lines))


def commit_as(repo: Path, author: str, date: str, subject: str, trailers: str = "") -> None:
    name, mail = author.split(" <")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{subject}\n\nWhy this change exists, in our words.\n{trailers}",
        env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail.rstrip(">"), "GIT_AUTHOR_DATE": date})


@pytest.fixture
def workspace(tmp_path):
    """upstream repo (tag base + two patch commits on a dev branch), a catalog made from them."""
    up = tmp_path / "upstream"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    (up / "notes.txt").write_text("".join(f"line {i}: the quick brown fox\n" for i in range(1, 41)))
    (up / "run.sh").write_text("#!/bin/sh\necho hi\n")
    git(up, "add", "-A")
    git(up, "commit", "-q", "-m", "base")
    git(up, "tag", "base")
    git(up, "checkout", "-q", "-b", "dev")
    edit(up / "notes.txt", 4, "line 5: the quick red fox")
    edit(up / "notes.txt", 30, insert="line 30b: inserted")
    commit_as(up, "Ada Author <ada@patcher.invalid>", "2026-01-02T03:04:05+00:00",
              "notes: a red fox", TRAILERS.format(id="PT-0001", version=VERSION))
    edit(up / "notes.txt", 4, "line 5: the quick red fox jumps")  # depends on PT-0001
    (up / "extra").mkdir()
    (up / "extra" / "config.txt").write_text("a new file\n")
    commit_as(up, "Bob Builder <bob@patcher.invalid>", "2026-02-03T04:05:06+01:00",
              "notes: the fox jumps, add a config", TRAILERS.format(id="PT-0002", version=VERSION))
    catalog = tmp_path / "catalog"
    (catalog / "patches" / VERSION).mkdir(parents=True)
    (catalog / "patches" / VERSION / "series").write_text("# test series\n")
    patches.new_patches(catalog / "patches", VERSION, up, "base..dev")
    git(up, "checkout", "-q", "main")

    class W:
        upstream = up
        patches_dir = catalog / "patches"
        root = tmp_path

        @staticmethod
        def clone(name="tree") -> Path:
            dest = tmp_path / name
            git(tmp_path, "clone", "-q", str(up), str(dest))
            return dest

        @staticmethod
        def series():
            return patches.load_series(catalog / "patches", VERSION)

    W.catalog = catalog
    return W


def test_new_exported_the_commits_and_appended_the_series(workspace):
    series_text = (workspace.patches_dir / VERSION / "series").read_text()
    assert series_text == "# test series\n0001-notes-a-red-fox.patch\n0002-notes-the-fox-jumps-add-a-config.patch\n"
    series = workspace.series()
    assert series.ids == ["PT-0001", "PT-0002"]
    first, second = series.patches
    assert first.author == "Ada Author <ada@patcher.invalid>"
    assert second.files == ("extra/config.txt", "notes.txt")
    assert first.text.startswith("From 0000000000000000000000000000000000000000 ")


def test_new_refuses_commits_without_trailers_and_writes_nothing(workspace, patcher_cli):
    up = workspace.upstream
    git(up, "checkout", "-q", "-b", "plain", "base")
    edit(up / "notes.txt", 10, "line 11: changed")
    commit_as(up, "Ada Author <ada@patcher.invalid>", "2026-01-02T03:04:05+00:00", "notes: no trailers")
    sha = git(up, "rev-parse", "HEAD")[:12]
    before = sorted(p.name for p in (workspace.patches_dir / VERSION).iterdir())
    series_before = (workspace.patches_dir / VERSION / "series").read_text()
    result = patcher_cli("--catalog", workspace.catalog, "patches", "new", "--torch", VERSION,
                         "--from-commits", "base..plain", "--source", up)
    assert result.exit_code == PatchFormatError.exit_code
    assert f"commit {sha} (notes: no trailers): missing trailer(s) Patch-Id" in result.stderr
    assert sorted(p.name for p in (workspace.patches_dir / VERSION).iterdir()) == before
    assert (workspace.patches_dir / VERSION / "series").read_text() == series_before


def test_new_refuses_a_patch_id_already_in_the_series(workspace, patcher_cli):
    result = patcher_cli("--catalog", workspace.catalog, "patches", "new", "--torch", VERSION,
                         "--from-commits", "base..dev", "--source", workspace.upstream, "--dry-run")
    assert result.exit_code == PatchFormatError.exit_code
    assert "Patch-Id PT-0001 is already used by 0001-notes-a-red-fox.patch" in result.stderr


def test_new_dry_run_writes_nothing(workspace, patcher_cli, tmp_path):
    other = tmp_path / "other-catalog"
    (other / "patches" / VERSION).mkdir(parents=True)
    (other / "patches" / VERSION / "series").write_text("")
    result = patcher_cli("--catalog", other, "patches", "new", "--torch", VERSION,
                         "--from-commits", "base..dev", "--source", workspace.upstream, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "would add PT-0001 0001-notes-a-red-fox.patch" in result.stdout
    assert [p.name for p in (other / "patches" / VERSION).iterdir()] == ["series"]


def test_check_then_apply_one_commit_per_patch(workspace, patcher_cli):
    tree = workspace.clone()
    base = git(tree, "rev-parse", "HEAD")
    check = patcher_cli("--catalog", workspace.catalog, "patches", "check", "--torch", VERSION, "--source", tree)
    assert check.exit_code == 0, check.stderr
    assert "ok: all 2 patches" in check.stdout
    dry = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree,
                      "--dry-run")
    assert dry.exit_code == 0 and git(tree, "rev-parse", "HEAD") == base

    result = patches.apply_series(workspace.series(), tree)
    assert result.base == base and not result.already_applied
    assert [p.id for p in result.patches] == ["PT-0001", "PT-0002"]
    assert result.head == git(tree, "rev-parse", "HEAD") == result.patches[-1].commit
    assert result.tree_hash == tree_hash(tree)
    log = git(tree, "log", "--format=%an|%ae|%ad|%cn|%ce|%cd|%s", "--date=iso-strict", f"{base}..HEAD")
    assert log.splitlines() == [
        "Bob Builder|bob@patcher.invalid|2026-02-03T04:05:06+01:00|Bob Builder|bob@patcher.invalid|"
        "2026-02-03T04:05:06+01:00|notes: the fox jumps, add a config",
        "Ada Author|ada@patcher.invalid|2026-01-02T03:04:05Z|Ada Author|ada@patcher.invalid|"
        "2026-01-02T03:04:05Z|notes: a red fox",
    ]
    assert "Patch-Id: PT-0002" in git(tree, "log", "-1", "--format=%B")
    assert (tree / "extra" / "config.txt").read_text() == "a new file\n"
    assert git(tree, "status", "--porcelain") == ""


def test_apply_is_idempotent(workspace, patcher_cli):
    tree = workspace.clone()
    first = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert first.exit_code == 0, first.stderr
    head = git(tree, "rev-parse", "HEAD")
    again = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert again.exit_code == 0, again.stderr
    assert "already applied" in again.stdout
    assert git(tree, "rev-parse", "HEAD") == head
    check = patcher_cli("--catalog", workspace.catalog, "patches", "check", "--torch", VERSION, "--source", tree)
    assert check.exit_code == 0 and "already applied" in check.stdout
    result = patches.apply_series(workspace.series(), tree)
    assert result.already_applied and result.base == git(tree, "rev-parse", "HEAD~2")
    assert [p.commit for p in result.patches] == [git(tree, "rev-parse", "HEAD~1"), head]


def test_two_clones_patched_separately_are_identical(workspace):
    one = patches.apply_series(workspace.series(), workspace.clone("one"))
    two = patches.apply_series(workspace.series(), workspace.clone("two"))
    assert one.tree_hash == two.tree_hash
    assert one.head == two.head  # fixed identities and dates: the same commits


def test_a_patch_that_no_longer_applies_names_file_hunk_and_line(workspace, patcher_cli):
    tree = workspace.clone()
    edit(tree / "notes.txt", 3, "line 4: the quick grey fox")  # a context line of PT-0001's first hunk
    git(tree, "commit", "-q", "-am", "upstream moved on")
    head = git(tree, "rev-parse", "HEAD")
    result = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert result.exit_code == PatchApplyError.exit_code
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert ("PT-0001 (0001-notes-a-red-fox.patch) does not apply: notes.txt, hunk @@ -2,7 +2,7 @@: "
            "line 4 expected 'line 4: the quick brown fox', found 'line 4: the quick grey fox'") in result.stderr
    assert git(tree, "rev-parse", "HEAD") == head and git(tree, "status", "--porcelain") == ""


def test_offsets_are_refused(workspace):
    """git apply would find the hunks a line further down; an exact apply must not."""
    tree = workspace.clone()
    edit(tree / "notes.txt", 0, insert="line 0: a new first line")
    git(tree, "commit", "-q", "-am", "a line on top")
    with pytest.raises(PatchApplyError, match=r"hunk @@ -2,7 \+2,7 @@: line 2 expected "
                                              r"'line 2: the quick brown fox', found 'line 1: the quick brown fox'"):
        patches.check_series(workspace.series(), tree)


def test_second_patch_failing_reports_after_the_first_in_memory(workspace):
    """PT-0002 depends on PT-0001; a tree lacking PT-0002's own context fails at PT-0002."""
    tree = workspace.clone()
    edit(tree / "notes.txt", 5, "line 6: changed")  # context of both patches' first hunk
    git(tree, "commit", "-q", "-am", "change line 6")
    with pytest.raises(PatchApplyError, match="PT-0001 .* line 6 expected"):
        patches.check_series(workspace.series(), tree)


def test_a_partly_applied_series_is_named(workspace, patcher_cli):
    tree = workspace.clone()
    git(tree, "am", "-q", workspace.series().patches[0].path)
    result = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert result.exit_code == PatchApplyError.exit_code
    assert f"the series of torch 1.13.1 is partly in {tree}: PT-0001 applied, PT-0002 not" in result.stderr


def test_dirty_tree_is_refused(workspace, patcher_cli):
    tree = workspace.clone()
    (tree / "run.sh").write_text("changed\n")
    result = patcher_cli("--catalog", workspace.catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert result.exit_code == DirtyTreeError.exit_code
    assert "has uncommitted changes" in result.stderr
    git(tree, "checkout", "--", "run.sh")
    (tree / "stray.o").write_text("x")
    with pytest.raises(DirtyTreeError, match=r"\?\? stray.o"):
        patches.check_series(workspace.series(), tree)


def test_not_a_working_tree(workspace, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(PatchApplyError, match="is not the top of a git working tree"):
        patches.apply_series(workspace.series(), plain)


def test_a_failure_midway_resets_to_the_starting_commit(workspace, monkeypatch):
    """Fault injection: git am fails on the second patch; the tree returns to where it was."""
    tree = workspace.clone()
    base = git(tree, "rev-parse", "HEAD")
    real_run_git = patches.run_git
    calls = {"am": 0}

    def failing(*args, **kwargs):
        if args and args[0] == "am" and "--abort" not in args:
            calls["am"] += 1
            if calls["am"] == 2:
                (tree / "notes.txt").write_text("half-written\n")  # as a crashed apply would leave it
                return real_run_git("am", "/nonexistent.patch", **kwargs)
        return real_run_git(*args, **kwargs)

    monkeypatch.setattr(patches, "run_git", failing)
    with pytest.raises(PatchApplyError, match="PT-0002 .* git am failed"):
        patches.apply_series(workspace.series(), tree)
    assert git(tree, "rev-parse", "HEAD") == base
    assert git(tree, "status", "--porcelain") == ""
    assert not (tree / ".git" / "rebase-apply").exists()


def test_refresh_re_exports_edited_commits(workspace, patcher_cli):
    tree = workspace.clone()
    patches.apply_series(workspace.series(), tree)
    unchanged = patcher_cli("--catalog", workspace.catalog, "patches", "refresh", "--torch", VERSION,
                            "--source", tree)
    assert unchanged.exit_code == 0, unchanged.stderr
    assert unchanged.stdout.splitlines() == ["unchanged PT-0001 0001-notes-a-red-fox.patch",
                                             "unchanged PT-0002 0002-notes-the-fox-jumps-add-a-config.patch"]
    # edit the last patch in place, as a maintainer would
    (tree / "extra" / "config.txt").write_text("a new file, reworded\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    old_sha = workspace.series().patches[1].sha256
    dry = patcher_cli("--catalog", workspace.catalog, "patches", "refresh", "--torch", VERSION,
                      "--source", tree, "--dry-run")
    assert "would update PT-0002" in dry.stdout and workspace.series().patches[1].sha256 == old_sha
    result = patcher_cli("--catalog", workspace.catalog, "patches", "refresh", "--torch", VERSION,
                         "--source", tree)
    assert "updated PT-0002 0002-notes-the-fox-jumps-add-a-config.patch" in result.stdout
    refreshed = workspace.series().patches[1]
    assert refreshed.sha256 != old_sha and "+a new file, reworded" in refreshed.text
    fresh = patches.apply_series(workspace.series(), workspace.clone("fresh"))
    assert fresh.tree_hash == tree_hash(tree)


def test_refresh_refuses_a_tree_without_the_series(workspace):
    with pytest.raises(PatchNotFoundError, match="carry no Patch-Id, but the series of torch 1.13.1 is PT-0001, PT-0002"):
        patches.refresh_series(workspace.patches_dir, VERSION, workspace.clone())
