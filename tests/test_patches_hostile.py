"""Hostile patches (issue 15, item 6): every change git can express that a source patch of PyTorch
has no business making is refused by `patcher patches check` and `apply`, before the tree is
touched, with one line naming the patch and the file, and exit code 34.

Each hostile patch is made by real git (a commit exported with `git format-patch`, with the
options that make git express the change) where git can make it; paths git refuses to commit
(absolute, `..`, `.git/`) are written into an exported patch by hand, as an attacker would.
Every case runs the real CLI in a child process against a clone and then checks that HEAD, the
index, the working tree (ignored files included) and the directory outside the tree are as
they were.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from patcher import patches
from patcher.errors import HostilePatchError
from patcher.source import tree_hash

VERSION = "1.13.1"
TRAILERS = """
Patch-Id: PT-0666
Applies-To: =={version}
Category: bugfix
Upstream-Bug: none
Upstream-Fix: none
Probe: env.fingerprint
Upstream-Tests: test_notes.py -k "fox"
"""
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "Eve", "GIT_AUTHOR_EMAIL": "eve@patcher.invalid",
           "GIT_COMMITTER_NAME": "Eve", "GIT_COMMITTER_EMAIL": "eve@patcher.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}
NOTES = "".join(f"line {i}: the quick brown fox\n" for i in range(1, 21))


def git(cwd, *args, check=True) -> str:
    proc = subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd,
                          env=dict(os.environ, **GIT_ENV), capture_output=True, text=True)
    assert not check or proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    """A small tree with what a hostile patch aims at: an executable script, a symbolic link
    leading outside, a submodule (gitlink + .gitmodules), .gitignore'd build output."""
    root = tmp_path_factory.mktemp("hostile")
    outside = root / "outside"
    outside.mkdir()
    sub = root / "subrepo"
    sub.mkdir()
    git(sub, "init", "-q", "-b", "main")
    (sub / "sub.txt").write_text("submodule content\n")
    git(sub, "add", "-A")
    git(sub, "commit", "-q", "-m", "sub")
    up = root / "upstream"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    (up / "notes.txt").write_text(NOTES)
    (up / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (up / "run.sh").chmod(0o755)
    (up / "logo.txt").write_text("a logo, as text\n")
    (up / "vendor").symlink_to(outside)  # a tracked symbolic link that leads out of the tree
    (up / ".gitignore").write_text("build\n")
    git(up, "add", "-A")
    git(up, "submodule", "add", "-q", str(sub), "third_party/sub")
    git(up, "commit", "-q", "-m", "base")
    git(up, "tag", "base")
    return up


def export(up: Path, change, *format_args: str, name: str = "case", stage: bool = True) -> str:
    """Commit ``change(repo)`` on a branch from base and export it as git format-patch does."""
    git(up, "checkout", "-q", "-B", name, "base")
    change(up)
    if stage:
        git(up, "add", "-A")
    git(up, "commit", "-q", "-m", f"a change\n\nWhy it exists, in our words.\n{TRAILERS.format(version=VERSION)}")
    text = git(up, "format-patch", "--stdout", "-1", "--zero-commit", "--full-index", *format_args, "HEAD")
    git(up, "checkout", "-q", "main")
    git(up, "submodule", "update", "-q", "--init")
    return text + "\n"


def edit_notes(up: Path, line: str = "line 5: the quick red fox") -> None:
    text = (up / "notes.txt").read_text().splitlines(keepends=True)
    text[4] = line + "\n"
    (up / "notes.txt").write_text("".join(text))


def plain(up: Path) -> str:
    return export(up, edit_notes, "--no-renames")


def rename_paths(text: str, old: str, new: str) -> str:
    """Point an exported patch at another path, as a hand-edited hostile patch would."""
    return (text.replace(f"a/{old}", f"a/{new}").replace(f"b/{old}", f"b/{new}")
            .replace(f" {old} ", f" {new} "))


def creating(up: Path, path: str) -> str:
    """A patch creating ``path`` (made for extra.txt, then pointed at ``path``)."""
    text = export(up, lambda r: (r / "extra.txt").write_text("planted\n"), "--no-renames")
    return rename_paths(text, "extra.txt", path)


def symlink_change(up: Path, target: str) -> None:
    (up / "vendor").unlink()
    (up / "vendor").symlink_to(target)


def move_submodule(up: Path) -> None:
    sub = up / "third_party" / "sub"
    (sub / "sub.txt").write_text("moved\n")
    git(sub, "commit", "-q", "-am", "moved")


def remove_submodule(up: Path) -> None:
    git(up, "rm", "-q", "--cached", "third_party/sub")
    shutil.rmtree(up / "third_party" / "sub")  # or `git add -A` would add it again


def edit_gitmodules(up: Path) -> None:
    path = up / ".gitmodules"
    path.write_text(path.read_text().replace("url = ", "url = file:///tmp/evil#"))


def hidden_in_diffstat(up: Path) -> str:
    """A traditional diff placed in the diffstat, where git apply finds it and no reviewer looks."""
    text = plain(up)
    hidden = ("--- a/logo.txt\n+++ b/logo.txt\n@@ -1 +1 @@\n-a logo, as text\n+a planted line\n")
    return text.replace("\ndiff --git ", "\n" + hidden + "\ndiff --git ", 1)


def hidden_after_signature(up: Path) -> str:
    text = plain(up)
    return text + "\n--- a/logo.txt\n+++ b/logo.txt\n@@ -1 +1 @@\n-a logo, as text\n+a planted line\n"


def two_messages(up: Path) -> str:
    """An mbox with a second message: git am would commit both."""
    first = plain(up)
    second = export(up, lambda r: (r / "logo.txt").write_text("a planted line\n"), "--no-renames", name="second")
    return first + second


def two_messages_unsigned(up: Path) -> str:
    """The same without the first signature and the second's diffstat: the second message reads as
    more of the first diff here, and git mailsplit still finds two messages."""
    first, second = plain(up), export(up, lambda r: (r / "logo.txt").write_text("a planted line\n"),
                                      "--no-renames", name="second")
    second = re.sub(r"\n---\n.*?\n(?=diff --git )", "\n", second, count=1, flags=re.S)
    return re.sub(r"\n-- \n[^\n]*\n+$", "\n", first) + second


def quoted_printable(up: Path) -> str:
    """A transfer encoding: git am decodes =3D to '=', the reviewed text shows '=3D'."""
    text = export(up, lambda r: edit_notes(r, "line 5: x =3D 1"), "--no-renames")
    return text.replace("Subject: ", "Content-Type: text/plain; charset=UTF-8\n"
                                     "Content-Transfer-Encoding: quoted-printable\nSubject: ", 1)


def renamed_header_mismatch(up: Path) -> str:
    """'diff --git' names notes.txt, the +++ line another file."""
    return plain(up).replace("+++ b/notes.txt", "+++ b/logo.txt")


# id -> (how to make the patch text, the file the message names, the phrase of the refusal)
CASES = {
    "mode-change": (lambda up: export(up, lambda r: (r / "notes.txt").chmod(0o755)),
                    "notes.txt", "changes the file mode from 100644 to 100755"),
    "mode-change-with-content": (lambda up: export(up, lambda r: (edit_notes(r), (r / "notes.txt").chmod(0o755))),
                                 "notes.txt", "changes the file mode from 100644 to 100755"),
    "executable-bit-removed": (lambda up: export(up, lambda r: (r / "run.sh").chmod(0o644)),
                               "run.sh", "changes the file mode from 100755 to 100644"),
    "new-executable": (lambda up: export(up, lambda r: ((r / "tool.sh").write_text("#!/bin/sh\n"),
                                                        (r / "tool.sh").chmod(0o755))),
                       "tool.sh", "creates an executable file (mode 100755)"),
    "new-symlink": (lambda up: export(up, lambda r: (r / "passwd").symlink_to("/etc/passwd")),
                    "passwd", "creates a symbolic link (mode 120000)"),
    "symlink-retargeted": (lambda up: export(up, lambda r: symlink_change(r, "/etc")),
                           "vendor", "changes the target of a symbolic link (mode 120000)"),
    "symlink-deleted": (lambda up: export(up, lambda r: (r / "vendor").unlink()),
                        "vendor", "deletes a symbolic link (mode 120000)"),
    "symlink-to-file": (lambda up: export(up, lambda r: ((r / "vendor").unlink(),
                                                         (r / "vendor").write_text("now a file\n"))),
                        "vendor", "deletes a symbolic link (mode 120000)"),
    "rename": (lambda up: export(up, lambda r: git(r, "mv", "notes.txt", "renamed.txt"), "-M"),
               "notes.txt -> renamed.txt", "renames a file"),
    "copy": (lambda up: export(up, lambda r: (r / "copy.txt").write_text(NOTES), "-C", "--find-copies-harder"),
             "notes.txt -> copy.txt", "copies a file"),
    "binary": (lambda up: export(up, lambda r: (r / "logo.bin").write_bytes(b"\x89PNG\0\1\2"), "--binary"),
               "logo.bin", "binary change"),
    "binary-without-data": (lambda up: export(up, lambda r: (r / "logo.bin").write_bytes(b"\x89PNG\0\1\2")),
                            "logo.bin", "binary change"),
    "new-submodule": (lambda up: export(up, lambda r: git(r, "update-index", "--add", "--cacheinfo",
                                                          f"160000,{git(r, 'rev-parse', 'HEAD')},evil"),
                                        stage=False),
                      "evil", "adds a submodule (a gitlink, mode 160000)"),
    "submodule-moved": (lambda up: export(up, move_submodule), "third_party/sub",
                        "moves a submodule to another commit (a gitlink, mode 160000)"),
    "submodule-removed": (lambda up: export(up, remove_submodule),
                          "third_party/sub", "removes a submodule (a gitlink, mode 160000)"),
    "gitmodules": (lambda up: export(up, edit_gitmodules), ".gitmodules",
                   "changes the submodule configuration (.gitmodules)"),
    "gitattributes": (lambda up: export(up, lambda r: (r / ".gitattributes").write_text("*.txt eol=crlf\n")),
                      ".gitattributes", "changes git attributes"),
    "dot-git": (lambda up: creating(up, ".git/hooks/post-checkout"), ".git/hooks/post-checkout",
                "is inside git's own directory (.git)"),
    "dot-git-uppercase": (lambda up: creating(up, "sub/.GIT/config"), "sub/.GIT/config",
                          "is inside git's own directory (.git)"),
    "absolute": (lambda up: creating(up, "/tmp/planted.txt"), "/tmp/planted.txt",
                 "is an absolute path, outside the tree"),
    "dot-dot": (lambda up: creating(up, "../outside/planted.txt"), "../outside/planted.txt",
                "leaves the tree (a '..' component)"),
    "dot-dot-inside": (lambda up: creating(up, "aten/../../planted.txt"), "aten/../../planted.txt",
                       "leaves the tree (a '..' component)"),
    "through-tracked-symlink": (lambda up: creating(up, "vendor/planted.txt"), "vendor/planted.txt",
                                "leads through the symbolic link vendor of the tree"),
    "inside-submodule": (lambda up: creating(up, "third_party/sub/planted.txt"), "third_party/sub/planted.txt",
                         "lies inside the submodule third_party/sub"),
    "through-ignored-symlink": (lambda up: creating(up, "build/planted.txt"), "build/planted.txt",
                                "leads through the symbolic link build of the tree"),
    "hidden-in-diffstat": (hidden_in_diffstat, "(the mbox)",
                           "has a line git would read as part of a patch before the first 'diff --git' line"),
    "hidden-after-signature": (hidden_after_signature, "(the mbox)",
                               "has a line git would read as part of a patch after the signature"),
    "two-messages": (two_messages, "(the mbox)", "has a line git would read as part of a patch after the signature"),
    "two-messages-unsigned": (two_messages_unsigned, "(the mbox)", "git am would read 2 messages from it, not one"),
    "quoted-printable": (quoted_printable, "(the mbox)", "git am would apply another text than the diff read here"),
    "header-mismatch": (renamed_header_mismatch, "notes.txt", "its '---'/'+++' lines name 'a/notes.txt' and "
                                                              "'b/logo.txt', its 'diff --git' line 'notes.txt'"),
}


def catalog_with(tmp_path: Path, text: str) -> Path:
    catalog = tmp_path / "catalog"
    directory = catalog / "patches" / VERSION
    directory.mkdir(parents=True)
    (directory / "0666-hostile.patch").write_text(text)
    (directory / "series").write_text("0666-hostile.patch\n")
    return catalog


def snapshot(tree: Path, outside: Path) -> tuple:
    return (git(tree, "rev-parse", "HEAD"), git(tree, "status", "--porcelain", "--ignored"),
            git(tree, "ls-files", "-s"), tree_hash(tree), sorted(p.name for p in outside.iterdir()),
            sorted(p.name for p in (tree / ".git" / "hooks").iterdir()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_patch_is_refused_before_the_tree_is_touched(case, upstream, tmp_path, patcher_cli):
    make, file, phrase = CASES[case]
    text = make(upstream)
    catalog = catalog_with(tmp_path, text)
    tree = tmp_path / "tree"
    git(tmp_path, "clone", "-q", "--recurse-submodules", str(upstream), str(tree))
    outside = upstream.parent / "outside"
    (tree / "build").symlink_to(outside)  # ignored build output that leads out of the tree
    before = snapshot(tree, outside)
    for command in ("check", "apply"):
        result = patcher_cli("--catalog", catalog, "patches", command, "--torch", VERSION, "--source", tree)
        assert result.exit_code == HostilePatchError.exit_code == 34, (command, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(f"patcher: error: 0666-hostile.patch (PT-0666): refused: {file}: {phrase}"), \
            result.stderr
        assert snapshot(tree, outside) == before, command
    assert not Path("/tmp/planted.txt").exists()


def test_what_a_source_patch_may_do_still_applies(upstream, tmp_path, patcher_cli):
    """Changing text (an executable script's too, its mode unchanged), creating a regular file and
    deleting a regular file are what source patches do: allowed, and every line is in the diff."""
    def change(repo: Path) -> None:
        edit_notes(repo)
        (repo / "run.sh").write_text("#!/bin/sh\necho hello\n")  # stays 100755
        (repo / "new.txt").write_text("a new file\n")
        (repo / "logo.txt").unlink()
    text = export(upstream, change, "--no-renames")
    assert "index " in text and " 100755\n" in text and "deleted file mode 100644" in text
    catalog = catalog_with(tmp_path, text)
    tree = tmp_path / "tree"
    git(tmp_path, "clone", "-q", "--recurse-submodules", str(upstream), str(tree))
    result = patcher_cli("--catalog", catalog, "patches", "apply", "--torch", VERSION, "--source", tree)
    assert result.exit_code == 0, result.stderr
    assert not (tree / "logo.txt").exists() and (tree / "new.txt").read_text() == "a new file\n"
    assert os.access(tree / "run.sh", os.X_OK)
    assert git(tree, "ls-files", "-s", "run.sh").startswith("100755 ")


def test_patches_new_refuses_a_hostile_commit(upstream, tmp_path, patcher_cli):
    """`patcher patches new` exports with --no-renames, but a mode change stays a mode change."""
    git(upstream, "checkout", "-q", "-B", "chmod", "base")
    (upstream / "notes.txt").chmod(0o755)
    git(upstream, "commit", "-q", "-am", f"chmod\n\nWhy.\n{TRAILERS.format(version=VERSION)}")
    sha = git(upstream, "rev-parse", "HEAD")[:12]
    git(upstream, "checkout", "-q", "main")
    catalog = tmp_path / "catalog"
    (catalog / "patches" / VERSION).mkdir(parents=True)
    (catalog / "patches" / VERSION / "series").write_text("")
    result = patcher_cli("--catalog", catalog, "patches", "new", "--torch", VERSION,
                         "--from-commits", "base..chmod", "--source", upstream)
    assert result.exit_code == 34, result.stderr
    assert f"commit {sha} (chmod) (PT-0666): refused: notes.txt: changes the file mode" in result.stderr
    assert (catalog / "patches" / VERSION / "series").read_text() == ""


@pytest.mark.parametrize(("path", "problem"), [
    ("aten/src/x.cpp", None),
    ("test/test_nn.py", None),
    ("a b/c.txt", None),
    ("", "has an empty file name"),
    ("/etc/passwd", "is an absolute path, outside the tree"),
    ("a//b", "is not a plain relative path (an empty or '.' component)"),
    ("./a", "is not a plain relative path (an empty or '.' component)"),
    ("a/../b", "leaves the tree (a '..' component)"),
    (".git", "is inside git's own directory (.git)"),
    ("x/.Git/config", "is inside git's own directory (.git)"),
    (".git. /config", "is inside git's own directory (.git)"),
    ("GIT~1/config", "is inside git's own directory (.git)"),
    ("third_party/.gitmodules", "changes the submodule configuration (.gitmodules)"),
    ("a\\b", "has a backslash in its name (a path separator on Windows)"),
    ("a\nb", "has control characters in its name"),
])
def test_path_problems(path, problem):
    assert patches.path_problem(path) == problem


def test_the_policy_is_documented():
    readme = (Path(__file__).resolve().parent.parent / "patches" / "README.md").read_text()
    section = readme[readme.index("## What a patch may change"):]
    for needed in ("mode", "symbolic link", "submodule", "rename", "binary", "delete", ".gitmodules",
                   "exit code 34"):
        assert needed in section, needed
    assert re.search(r"HostilePatchError", (Path(patches.__file__).parent / "errors.py").read_text())
