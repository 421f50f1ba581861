"""Patch stage: the catalog's series for one torch version, checked and applied to a SourceTree.

The catalog: ``patches/<version>/series`` names the patch files in order (one a line, ``#``
starts a comment); each file is a ``git format-patch`` mbox whose commit message ends with the
trailers ``Patch-Id`` (PT-NNNN), ``Applies-To`` (a PEP 440 specifier that must contain the
directory's version), ``Category`` (bugfix | security | determinism | build), ``Upstream-Bug``
and ``Upstream-Fix`` (comma-separated URLs, or ``none``), ``Probe`` (comma-separated probe
check ids) and ``Upstream-Tests`` (upstream's own tests that exercise the patched code: pytest
node ids or ``FILE -k "EXPR"`` selections relative to the tree's ``test/``).  Every patch is parsed and validated before any tree is touched; each kind of
damage has its own message.

A patch may only change the text of regular files of the tree, create regular files (mode
100644) and delete regular files; every other change git can express (modes, symbolic links,
submodules, renames and copies, binary content, paths outside the tree's own files, and anything
git am would read differently from this parser) is refused with ``HostilePatchError`` (exit 34)
before any tree is touched: by the model where the patch text alone shows it, by
``check_series`` where it takes the tree or git's own reading (patches/README.md lists them).

Applying is exact: every hunk's old lines must be found at the line its header names (no fuzz,
no offsets).  That check is our own, over the blobs of HEAD with the earlier patches applied in
memory, so a failure names the file, the hunk and the first differing line.  Only a series that
passes it is handed to ``git am`` (one commit per patch, committer = author, committer date =
author date), so the patched commits and tree are reproducible.  A tree that already holds the
series (the reversed series applies exactly) is reported as "already applied", not as an error.
"""

from __future__ import annotations

import difflib
import email.parser
import email.policy
import email.utils
import functools
import hashlib
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patcher.errors import (
    DirtyTreeError,
    HostilePatchError,
    PatchApplyError,
    PatchFormatError,
    PatchNotFoundError,
)
from patcher.gitrun import GitCommandFailed, last_line, reports_failures_as, run_git
from patcher.source import tree_hash

TRAILERS = ("Patch-Id", "Applies-To", "Category", "Upstream-Bug", "Upstream-Fix", "Probe", "Upstream-Tests")
CATEGORIES = ("bugfix", "security", "determinism", "build")
PATCH_ID_RE = re.compile(r"^PT-\d{4}$")
PROBE_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
URL_RE = re.compile(r"^https?://\S+$")
VERSION_DIR_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
TRAILER_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*):\s*(.*)$")

# Flags that make `git format-patch` output independent of the user's git config.
_FORMAT_PATCH = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.relative=false",
                 "-c", "format.signature=", "-c", "core.quotePath=true", "-c", "format.signOff=false",
                 "format-patch", "--stdout", "--zero-commit", "--no-signature", "--full-index",
                 "--no-renames", "--no-color", "--no-thread", "--subject-prefix=PATCH", "--no-numbered",
                 "--no-to", "--no-cc", "--encode-email-headers")


# --- the model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpstreamTest:
    """One selection of upstream's own tests, relative to the tree's ``test/`` directory.

    Either a pytest node id (``test_jit.py::TestScript::test_calls_in_type_annotations``) or a
    file with a ``-k`` expression (``test_nn.py -k "CTCLoss or ctc_loss"``).
    """

    file: str  # e.g. "test_nn.py" or "jit/test_save_load.py"
    node: tuple[str, ...] = ()  # class / function names after the file
    keyword: str | None = None  # a pytest -k expression

    def __str__(self) -> str:
        if self.keyword is not None:
            return f'{self.file} -k "{self.keyword}"'
        return "::".join((self.file, *self.node))

    @property
    def node_id(self) -> str | None:
        return "::".join((self.file, *self.node)) if self.node else None


@dataclass(frozen=True)
class Hunk:
    header: str
    old_start: int
    old_count: int
    old_lines: tuple[str, ...]  # context and removed lines, each with its "\n" (but a last line without)
    new_lines: tuple[str, ...]

    def reversed(self) -> Hunk:
        new_start = int(HUNK_RE.match(self.header).group(3))
        return Hunk(self.header, new_start, len(self.new_lines), self.new_lines, self.old_lines)


@dataclass(frozen=True)
class FileChange:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    hunks: tuple[Hunk, ...]
    added: int = 0  # "+" lines, as `git apply --numstat` counts them
    removed: int = 0  # "-" lines

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    def reversed(self) -> FileChange:
        return FileChange(self.new_path, self.old_path, tuple(h.reversed() for h in self.hunks),
                          self.removed, self.added)


@dataclass(frozen=True)
class Patch:
    id: str
    file: str  # name inside patches/<version>/
    sha256: str
    subject: str
    author: str  # "Name <email>"
    date: str  # RFC 2822, as in the mbox
    trailers: dict[str, str]
    files: tuple[str, ...]
    path: str = ""
    text: str = field(default="", repr=False, compare=False)
    changes: tuple[FileChange, ...] = field(default=(), repr=False, compare=False)

    @property
    def category(self) -> str:
        return self.trailers["Category"]

    @property
    def applies_to(self) -> str:
        return self.trailers["Applies-To"]

    @property
    def probes(self) -> tuple[str, ...]:
        return _split_list(self.trailers["Probe"])

    @property
    def upstream_tests(self) -> tuple[UpstreamTest, ...]:
        return parse_upstream_tests(self.trailers["Upstream-Tests"])

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["text"], data["changes"]
        data["upstream_tests"] = [str(t) for t in self.upstream_tests]
        return data


@dataclass(frozen=True)
class Series:
    version: str
    directory: str
    patches: tuple[Patch, ...]

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.patches]

    @property
    def upstream_tests(self) -> tuple[UpstreamTest, ...]:
        """The union of the patches' Upstream-Tests, in series order, each once."""
        return tuple(dict.fromkeys(t for p in self.patches for t in p.upstream_tests))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "directory": self.directory,
                "patches": [p.to_json() for p in self.patches]}


@dataclass(frozen=True)
class CheckResult:
    version: str
    count: int
    already_applied: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AppliedPatch:
    id: str
    sha256: str
    commit: str | None


@dataclass(frozen=True)
class PatchedTree:
    version: str
    path: str
    base: str | None  # None when an already-applied series was not found as commits
    head: str
    patches: tuple[AppliedPatch, ...]
    tree_hash: str
    already_applied: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchedTree:
        data = dict(data)
        data["patches"] = tuple(AppliedPatch(**p) for p in data["patches"])
        return cls(**data)


@dataclass(frozen=True)
class RefreshChange:
    id: str
    file: str
    changed: bool
    old_sha256: str
    new_sha256: str


# --- parsing ---------------------------------------------------------------------------------
def _split_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _lines(text: str) -> list[str]:
    """Split on "\\n" only, keeping it (str.splitlines would also split on \\r, \\f, ...)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _version_of(directory: Path) -> str:
    return directory.name


def parse_patch_file(path: Path, version: str) -> Patch:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchNotFoundError(f"patch file {path} does not exist") from None
    return parse_patch(data, path.name, version, path=str(path))


def parse_patch(data: bytes, name: str, version: str, path: str = "") -> Patch:
    """Parse and validate one format-patch mbox; raise PatchFormatError naming the damage."""
    text = data.decode("utf-8", "surrogateescape")

    def fail(message: str, hint: str | None = None) -> PatchFormatError:
        return PatchFormatError(f"{name}: {message}", hint=hint)

    lines = _lines(text)
    _check_crlf(lines, fail)
    head_end = text.find("\n\n")
    if not lines or head_end < 0:
        raise fail("not a git format-patch mbox (no header block)", hint="make it with `git format-patch`")
    header_text = text[:head_end + 1]
    if header_text.startswith("From "):
        header_text = header_text.split("\n", 1)[1]
    headers = email.parser.HeaderParser(policy=email.policy.default).parsestr(header_text)
    for required in ("From", "Date", "Subject"):
        if not headers.get(required):
            raise fail(f"not a git format-patch mbox (no {required}: header)",
                       hint="make it with `git format-patch`")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(str(headers["Subject"]).split()))
    author = str(headers["From"])
    # The raw Date text (the parsed header would be normalised, e.g. "2 Jan" -> "02 Jan").
    raw_date = re.search(r"^Date:[ \t]*(.*)$", header_text, re.M)
    date = raw_date.group(1).strip() if raw_date else str(headers["Date"])

    body = text[head_end + 2:]
    diff_at = re.search(r"^diff --git ", body, re.M)
    if diff_at is None:
        if re.search(r"^GIT binary patch$|^Binary files ", body, re.M):
            raise fail("has a binary change", hint="binary content cannot be reviewed in a patch")
        raise fail("contains no diff (no 'diff --git' line)")
    message = body[:diff_at.start()]
    separator = re.search(r"^---$", message, re.M)
    if separator:
        message = message[:separator.start()]
    trailers = _parse_trailers(message, fail)
    _validate_trailers(trailers, version, fail)

    diff_text = _check_diff_structure(body[diff_at.start():], fail)

    def refuse(file: str, why: str) -> HostilePatchError:
        return HostilePatchError(f"{name} ({trailers['Patch-Id']}): refused: {file}: {why}", hint=HOSTILE_HINT)

    _refuse_hidden_patches(body[:diff_at.start()], body[diff_at.start() + len(diff_text):], refuse)
    _refuse_hostile_sections(diff_text, refuse)
    try:
        patchset = PatchSet(diff_text)
    except UnidiffParseError as exc:
        raise fail(f"the diff cannot be parsed: {exc}") from None
    changes = tuple(_file_change(pf, fail) for pf in patchset)
    if not changes:
        raise fail("contains no file changes")
    return Patch(id=trailers["Patch-Id"], file=name, sha256=hashlib.sha256(data).hexdigest(),
                 subject=subject, author=author, date=date, trailers=trailers,
                 files=tuple(c.path for c in changes), path=path, text=text, changes=changes)


def _check_crlf(lines: list[str], fail: Callable[..., PatchFormatError]) -> None:
    # Content lines may legitimately end in \r (a CRLF file); structural lines never do.
    structural = ("From ", "From:", "Subject:", "Date:", "diff --git ", "@@ ", "--- ", "+++ ", "index ")
    for number, line in enumerate(lines, 1):
        if line.endswith("\r\n") and line.startswith(structural):
            raise fail(f"has CRLF line endings (line {number}): damaged by an editor or mail client",
                       hint="convert it back to LF line endings, or export it again with git format-patch")


def _parse_trailers(message: str, fail: Callable[..., PatchFormatError]) -> dict[str, str]:
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip("\n")) if p.strip()]
    last = paragraphs[-1].splitlines() if len(paragraphs) > 1 else []
    trailers: dict[str, str] = {}
    key = None
    for line in last:
        m = TRAILER_RE.match(line)
        if m:
            key = m.group(1)
            if key in trailers and key in TRAILERS:
                raise fail(f"trailer {key} appears twice")
            trailers[key] = m.group(2).strip()
        elif line[:1] in (" ", "\t") and key:
            trailers[key] += " " + line.strip()  # folded trailer
        else:
            trailers = {}  # not a trailer block after all
            break
    missing = [k for k in TRAILERS if k not in trailers]
    if missing:
        raise fail(f"missing trailer(s) {', '.join(missing)} at the end of the commit message",
                   hint="every patch needs " + ", ".join(TRAILERS))
    return {k: trailers[k] for k in TRAILERS} | {k: v for k, v in trailers.items() if k not in TRAILERS}


def _validate_trailers(trailers: dict[str, str], version: str, fail: Callable[..., PatchFormatError]) -> None:
    if not PATCH_ID_RE.match(trailers["Patch-Id"]):
        raise fail(f"invalid Patch-Id {trailers['Patch-Id']!r}: it must look like PT-0123")
    if trailers["Category"] not in CATEGORIES:
        raise fail(f"invalid Category {trailers['Category']!r}: one of {', '.join(CATEGORIES)}")
    applies = trailers["Applies-To"]
    try:
        spec = SpecifierSet(applies)
        if not str(spec):
            raise InvalidSpecifier(applies)
    except InvalidSpecifier:
        raise fail(f"invalid Applies-To {applies!r}: it must be a version specifier such as ==1.13.1 "
                   f"or >=1.4,<1.6") from None
    try:
        contained = spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        contained = False
    if not contained:
        raise fail(f"Applies-To {applies!r} does not include {version}, the version of its directory",
                   hint="move it to the right patches/<version>/ or widen Applies-To")
    for key in ("Upstream-Bug", "Upstream-Fix"):
        value = trailers[key]
        if value != "none" and (not _split_list(value)
                                or not all(URL_RE.match(u) for u in _split_list(value))):
            raise fail(f"invalid {key} {value!r}: comma-separated URLs, or none")
    try:
        parse_upstream_tests(trailers["Upstream-Tests"])
    except ValueError as exc:
        raise fail(f"invalid Upstream-Tests {trailers['Upstream-Tests']!r}: {exc}",
                   hint='comma-separated pytest node ids or FILE -k "EXPR" selections, relative to '
                        "the tree's test/ directory, e.g. test_nn.py -k \"CTCLoss\", "
                        "test_jit.py::TestScript::test_calls_in_type_annotations") from None
    probes = _split_list(trailers["Probe"])
    if not probes:
        raise fail("empty Probe trailer: name the probe check ids that prove the patch")
    bad = [p for p in probes if not PROBE_ID_RE.match(p)]
    if bad:
        raise fail(f"invalid probe id(s) {', '.join(bad)} in Probe")
    known = probe_check_ids()
    if known is not None:
        unknown = [p for p in probes if p not in known]
        if unknown:
            close = sorted({m for u in unknown for m in difflib.get_close_matches(u, known, n=2)})
            raise fail(f"Probe names check id(s) the probe suite does not have: {', '.join(unknown)}",
                       hint=("did you mean " + ", ".join(close) + "? " if close else "")
                       + "check ids are registered in patcher/probe/checks")


_TEST_FILE_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$")
_TEST_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\[[A-Za-z0-9_.-]+\])?$")
_KEYWORD_TOKEN_RE = re.compile(r"\s*(?:(\()|(\))|([A-Za-z0-9_]+))")


def _check_keyword_expression(expr: str) -> None:
    """A pytest -k expression of names, and/or/not and parentheses (no other syntax)."""
    tokens: list[str] = []
    at = 0
    while at < len(expr):
        if expr[at:].strip() == "":
            break
        m = _KEYWORD_TOKEN_RE.match(expr, at)
        if not m:
            raise ValueError(f"-k expression {expr!r}: unexpected {expr[at:].strip()[:1]!r} "
                             f"(names, and, or, not and parentheses only)")
        tokens.append(m.group(0).strip())
        at = m.end()

    def operand(i: int) -> int:
        if i < len(tokens) and tokens[i] == "not":
            return operand(i + 1)
        if i < len(tokens) and tokens[i] == "(":
            i = expression(i + 1)
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError(f"-k expression {expr!r}: unbalanced parentheses")
            return i + 1
        if i < len(tokens) and tokens[i] not in ("and", "or", ")"):
            return i + 1
        raise ValueError(f"-k expression {expr!r}: a name is missing")

    def expression(i: int) -> int:
        i = operand(i)
        while i < len(tokens) and tokens[i] in ("and", "or"):
            i = operand(i + 1)
        return i

    if expression(0) != len(tokens):
        raise ValueError(f"-k expression {expr!r}: unbalanced parentheses or a missing and/or")


def parse_upstream_tests(value: str) -> tuple[UpstreamTest, ...]:
    """Parse an Upstream-Tests trailer; raise ValueError saying what is wrong."""
    out = []
    for item in _split_list(value):
        m = re.match(r'^(\S+)\s+-k\s+"([^"]*)"$', item)
        if m:
            file, keyword = m.group(1), m.group(2).strip()
            if not keyword:
                raise ValueError(f"{item!r}: empty -k expression")
            _check_keyword_expression(keyword)
            node: tuple[str, ...] = ()
        else:
            if re.search(r"\s", item):
                raise ValueError(f'{item!r}: a node id has no spaces; a keyword selection is FILE -k "EXPR"')
            file, *names = item.split("::")
            if not names:
                raise ValueError(f"{item!r}: a whole file is not a selection; name its tests "
                                 f"(FILE::Class::test) or give FILE -k \"EXPR\"")
            bad = [n for n in names if not _TEST_NAME_RE.match(n)]
            if bad:
                raise ValueError(f"{item!r}: {bad[0]!r} is not a test or class name")
            keyword, node = None, tuple(names)
        if not _TEST_FILE_RE.match(file) or ".." in file.split("/") or file.startswith("test/"):
            raise ValueError(f"{item!r}: {file!r} is not a .py file relative to the tree's test/ directory")
        out.append(UpstreamTest(file=file, node=node, keyword=keyword))
    if not out:
        raise ValueError("empty: name the upstream tests that exercise the patched code")
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _probe_ids_cached() -> frozenset[str] | None:
    try:
        import patcher.probe as probe  # the probe package may not exist yet in a checkout
    except ModuleNotFoundError as exc:
        if exc.name in ("patcher.probe",):
            return None
        raise
    all_ids = getattr(probe, "all_check_ids", None)
    return frozenset(all_ids()) if all_ids is not None else None


def probe_check_ids() -> frozenset[str] | None:
    """The probe registry's check ids, or None while patcher.probe does not expose them."""
    return _probe_ids_cached()


def _check_diff_structure(diff: str, fail: Callable[..., PatchFormatError]) -> str:
    """Walk the diff as git would; return it without a trailing '-- ' signature.

    Catches what unidiff reports only vaguely: hunks whose header counts disagree with their
    lines, hunks cut short by the end of the file, binary changes.
    """
    lines = _lines(diff)
    current = "?"
    header = ""
    old_left = new_left = 0
    old_declared = new_declared = 0
    in_hunk = False
    seen_hunk = False
    for index, raw in enumerate(lines):
        line = raw.rstrip("\n")
        if in_hunk:
            kind = line[:1]
            if kind in (" ", "") and line[:1] != "\\":
                old_left -= 1
                new_left -= 1
            elif kind == "-":
                old_left -= 1
            elif kind == "+":
                new_left -= 1
            elif kind != "\\":
                raise fail(f"{current}: hunk '{header}' declares {old_declared} old / {new_declared} new "
                           f"lines but has {old_declared - old_left} / {new_declared - new_left} before the "
                           f"next header (wrong hunk counts)", hint="the patch was edited by hand; export it again")
            if old_left < 0 or new_left < 0:
                raise fail(f"{current}: hunk '{header}' has more lines than its header declares "
                           f"({old_declared} old / {new_declared} new): wrong hunk counts",
                           hint="the patch was edited by hand; export it again")
            if old_left == 0 and new_left == 0:
                in_hunk = False
            continue
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.*) b/(.*)$", line)
            current = m.group(2) if m else line[11:]
        elif line.startswith("@@ "):
            m = HUNK_RE.match(line)
            if not m:
                raise fail(f"{current}: malformed hunk header {line!r}")
            header = line.split(" @@", 1)[0] + " @@"
            old_declared = old_left = int(m.group(2) if m.group(2) is not None else 1)
            new_declared = new_left = int(m.group(4) if m.group(4) is not None else 1)
            in_hunk = old_left > 0 or new_left > 0
            seen_hunk = True
        elif line == "GIT binary patch" or line.startswith("Binary files "):
            continue  # refused with the other changes no source patch makes (_refuse_hostile_sections)
        elif line == "-- ":
            return "".join(lines[:index])  # the format-patch signature
        elif line[:1] in (" ", "+", "-") and seen_hunk and not line.startswith(("--- ", "+++ ")):
            raise fail(f"{current}: hunk '{header}' has more lines than its header declares "
                       f"({old_declared} old / {new_declared} new): wrong hunk counts",
                       hint="the patch was edited by hand; export it again")
    if in_hunk:
        raise fail(f"{current}: hunk '{header}' is truncated: the file ends {max(old_left, new_left)} "
                   f"line(s) before the hunk does", hint="the file was cut short; export it again")
    return diff


# --- changes a source patch has no business making ------------------------------------------
# The policy: a patch of PyTorch's source changes the text of regular files of the tree, creates
# regular non-executable files (mode 100644) and may delete regular files (every deleted line is
# in the diff, so a reviewer sees what goes).  Everything else git can express is refused before
# any tree is touched: mode changes (the executable bit included), symbolic links, submodules
# (gitlinks, mode 160000), renames and copies (their content is not in the diff), binary
# content, paths that are absolute, contain "." / ".." / empty components, need quoting, or
# touch .git, .gitmodules or .gitattributes (which change how git itself treats the tree), and
# paths that lead through a symbolic link or a submodule of the tree (check_series).
HOSTILE_HINT = ("a source patch may only change the text of regular files, create regular files "
                "(mode 100644) and delete regular files inside the tree; see patches/README.md")
REGULAR_MODES = ("100644", "100755")
_GIT_OWN_FILES = {".gitmodules": "the submodule configuration (.gitmodules)",
                  ".gitattributes": "git attributes (.gitattributes decides filters and line endings "
                                    "of what is checked out)"}
_EXTENDED_HEADERS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
                     "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to ", "index ")
_INDEX_LINE_RE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+(?: (\d+))?$")
# Lines that make git apply start reading a patch: none may stand outside the diff sections.
_PATCH_START_RE = re.compile(r"^(diff -|--- |\+\+\+ |@@ |Index: |GIT binary patch$|Binary files )")


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a path of the tree's own files that a source patch may touch, or None."""
    if not path:
        return "has an empty file name"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "has control characters in its name"
    if path.startswith("/"):
        return "is an absolute path, outside the tree"
    if "\\" in path:
        return "has a backslash in its name (a path separator on Windows)"
    for part in path.split("/"):
        if part in ("", "."):
            return "is not a plain relative path (an empty or '.' component)"
        if part == "..":
            return "leaves the tree (a '..' component)"
        folded = part.casefold()
        if folded.rstrip(" .") == ".git" or folded == "git~1":
            return "is inside git's own directory (.git)"
        if folded in _GIT_OWN_FILES:
            return "changes " + _GIT_OWN_FILES[folded]
    return None


def _refuse_hidden_patches(before: str, after: str, refuse: Callable[[str, str], HostilePatchError]) -> None:
    """Nothing git apply would read as a patch may sit in the message, the diffstat or after the
    signature: git am would apply it, and no reviewer reads it as a change."""
    for where, text in (("before the first 'diff --git' line", before), ("after the signature", after)):
        for line in _lines(text):
            if _PATCH_START_RE.match(line):
                raise refuse("(the mbox)", f"has a line git would read as part of a patch {where}: "
                                           f"{line.rstrip()!r}")


def _diff_git_names(line: str) -> tuple[str, str] | None:
    """The a/ and b/ names of a 'diff --git' line (unquoted), or None when they cannot be told apart."""
    rest = line[len("diff --git "):]
    half, odd = divmod(len(rest) - 5, 2)
    if not odd and half > 0 and rest == f"a/{rest[2:2 + half]} b/{rest[2:2 + half]}":
        return rest[2:2 + half], rest[2:2 + half]
    m = re.match(r"^a/(\S+) b/(\S+)$", rest)
    return (m.group(1), m.group(2)) if m else None


def _refuse_hostile_sections(diff: str, refuse: Callable[[str, str], HostilePatchError]) -> None:
    """Read every file section's git header (between 'diff --git' and its first hunk) strictly."""
    sections: list[dict[str, Any]] = []
    section: dict[str, Any] | None = None
    for raw in _lines(diff):
        line = raw.rstrip("\n")
        if line.startswith("diff --git "):
            section = {"line": line, "ext": [], "minus": None, "plus": None, "binary": False, "hunks": 0,
                       "header": True}
            sections.append(section)
        elif section is None:
            continue
        elif not section["header"]:
            section["hunks"] += line.startswith("@@ ")
        elif line.startswith("@@ "):
            section["header"] = False
            section["hunks"] += 1
        elif line.startswith("--- "):
            section["minus"] = line[4:]
        elif line.startswith("+++ "):
            section["plus"] = line[4:]
        elif line == "GIT binary patch" or line.startswith("Binary files "):
            section["binary"] = True
            section["header"] = False
        else:
            section["ext"].append(line)
    for section in sections:
        _refuse_hostile_section(section, refuse)


def _refuse_hostile_section(section: dict[str, Any], refuse: Callable[[str, str], HostilePatchError]) -> None:
    line = section["line"]
    if '"' in line or any(n is not None and n.startswith('"') for n in (section["minus"], section["plus"])):
        raise refuse(line[len("diff --git "):], "has a quoted file name (control or non-ASCII characters)")
    names = _diff_git_names(line)
    if names is None:
        raise refuse(line[len("diff --git "):], "its 'diff --git' line does not name the file plainly")
    old, new = names
    headers: dict[str, str] = {}
    for ext in section["ext"]:
        key = next((k for k in _EXTENDED_HEADERS if ext.startswith(k)), None)
        if key is None:
            raise refuse(new, f"has a line git reads as an extended header: {ext!r}")
        headers[key.strip()] = ext[len(key):]
    for named in {old, new, headers.get("rename from"), headers.get("rename to"),
                  headers.get("copy from"), headers.get("copy to")} - {None}:
        problem = path_problem(named)
        if problem:
            raise refuse(named, problem)
    if "rename from" in headers or "rename to" in headers:
        raise refuse(f"{old} -> {new}", "renames a file (its content is not in the diff; export with --no-renames)")
    if "copy from" in headers or "copy to" in headers:
        raise refuse(f"{old} -> {new}", "copies a file (its content is not in the diff; export with --no-renames)")
    if "similarity index" in headers or "dissimilarity index" in headers:
        raise refuse(new, "is a rewrite or rename by similarity (export with --no-renames and without -B)")
    if old != new:
        raise refuse(f"{old} -> {new}", "names two files in its 'diff --git' line")
    if "old mode" in headers or "new mode" in headers:
        raise refuse(new, f"changes the file mode from {headers.get('old mode', '?')} to "
                          f"{headers.get('new mode', '?')}")
    created, deleted = headers.get("new file mode"), headers.get("deleted file mode")
    if created is not None and created != "100644":
        raise refuse(new, {"120000": "creates a symbolic link (mode 120000)",
                           "160000": "adds a submodule (a gitlink, mode 160000)",
                           "100755": "creates an executable file (mode 100755)"}.get(
                               created, f"creates a file of mode {created}"))
    if deleted is not None and deleted not in REGULAR_MODES:
        raise refuse(new, {"120000": "deletes a symbolic link (mode 120000)",
                           "160000": "removes a submodule (a gitlink, mode 160000)"}.get(
                               deleted, f"deletes a file of mode {deleted}"))
    index = headers.get("index")
    if index is not None:
        m = _INDEX_LINE_RE.match("index " + index)
        if not m:
            raise refuse(new, f"has a malformed index line {('index ' + index)!r}")
        if m.group(1) is not None and m.group(1) not in REGULAR_MODES:
            raise refuse(new, {"120000": "changes the target of a symbolic link (mode 120000)",
                               "160000": "moves a submodule to another commit (a gitlink, mode 160000)"}.get(
                                   m.group(1), f"changes a file of mode {m.group(1)}"))
    if section["binary"]:
        raise refuse(new, "binary change (ship binary content as a pinned input, not in a patch)")
    expected_minus = "/dev/null" if created is not None else f"a/{old}"
    expected_plus = "/dev/null" if deleted is not None else f"b/{new}"
    if section["hunks"]:
        if (section["minus"], section["plus"]) != (expected_minus, expected_plus):
            raise refuse(new, f"its '---'/'+++' lines name {section['minus']!r} and {section['plus']!r}, "
                              f"its 'diff --git' line {old!r}")
    elif created is None and deleted is None:
        raise refuse(new, "changes nothing that is shown (a file section without hunks)")


def _strip_prefix(path: str, prefix: str) -> str | None:
    if path in ("/dev/null", None):
        return None
    return path[len(prefix):] if path.startswith(prefix) else path


def _file_change(pf: Any, fail: Callable[..., PatchFormatError]) -> FileChange:
    if pf.is_binary_file:
        raise fail(f"{pf.path}: binary change", hint="binary content cannot be reviewed in a patch")
    old_path = None if pf.is_added_file else _strip_prefix(pf.source_file, "a/")
    new_path = None if pf.is_removed_file else _strip_prefix(pf.target_file, "b/")
    hunks = []
    for hunk in pf:
        old: list[str] = []
        new: list[str] = []
        last = ""
        for ln in hunk:
            kind = ln.line_type
            if kind == " ":
                old.append(ln.value)
                new.append(ln.value)
            elif kind == "-":
                old.append(ln.value)
            elif kind == "+":
                new.append(ln.value)
            elif kind == "\\":
                # "\ No newline at end of file" applies to the line just before it.
                if last in (" ", "-"):
                    old[-1] = old[-1][:-1] if old[-1].endswith("\n") else old[-1]
                if last in (" ", "+"):
                    new[-1] = new[-1][:-1] if new[-1].endswith("\n") else new[-1]
                continue
            else:
                continue
            last = kind
        header = f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"
        hunks.append(Hunk(header, hunk.source_start, hunk.source_length, tuple(old), tuple(new)))
    return FileChange(old_path, new_path, tuple(hunks), added=pf.added, removed=pf.removed)


# --- the series ------------------------------------------------------------------------------
def read_series_file(directory: Path) -> list[str]:
    series = Path(directory) / "series"
    try:
        text = series.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PatchNotFoundError(f"no patch series for torch {_version_of(Path(directory))} ({series} does not exist)",
                                 hint="see `patcher patches list` for the versions that have one") from None
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def load_series(patches_dir: Path, version: str) -> Series:
    """Parse and validate every patch of ``patches/<version>/series``, before anything is touched."""
    directory = Path(patches_dir) / version
    names = read_series_file(directory)
    seen_files: set[str] = set()
    seen_ids: dict[str, str] = {}
    patches = []
    for name in names:
        if name in seen_files:
            raise PatchFormatError(f"series of torch {version} lists {name} twice")
        seen_files.add(name)
        path = directory / name
        if not path.is_file():
            raise PatchNotFoundError(f"series of torch {version} lists {name}, but {path} does not exist",
                                     hint="add the file or remove the line from the series")
        patch = parse_patch_file(path, version)
        if patch.id in seen_ids:
            raise PatchFormatError(f"duplicate Patch-Id {patch.id}: in {seen_ids[patch.id]} and {name}",
                                   hint="every patch needs its own Patch-Id")
        seen_ids[patch.id] = name
        patches.append(patch)
    return Series(version=version, directory=str(directory), patches=tuple(patches))


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v))


def list_series(patches_dir: Path, version: str | None = None) -> list[Series]:
    if version is not None:
        return [load_series(patches_dir, version)]
    root = Path(patches_dir)
    versions = sorted((d.name for d in root.iterdir() if d.is_dir() and VERSION_DIR_RE.match(d.name)
                       and (d / "series").is_file()), key=_version_key) if root.is_dir() else []
    return [load_series(patches_dir, v) for v in versions]


def find_patch(patches_dir: Path, patch_id: str, version: str | None = None) -> list[tuple[str, Patch]]:
    found = [(s.version, p) for s in list_series(patches_dir, version) for p in s.patches if p.id == patch_id]
    if not found:
        where = f"the series of torch {version}" if version else "any series"
        raise PatchNotFoundError(f"no patch {patch_id} in {where}", hint="`patcher patches list` shows them")
    return found


# --- exact application in memory -------------------------------------------------------------
def _describe(line: str | None) -> str:
    return "end of file" if line is None else repr(line.rstrip("\n"))


class _Overlay:
    """File contents of HEAD with earlier patches applied in memory (path -> lines or None)."""

    def __init__(self, tree: Path):
        self.tree = tree
        self.files: dict[str, list[str] | None] = {}

    def get(self, path: str) -> list[str] | None:
        if path not in self.files:
            proc = run_git("cat-file", "-p", f"HEAD:{path}", cwd=self.tree, check=False)
            kind = run_git("cat-file", "-t", f"HEAD:{path}", cwd=self.tree, check=False).stdout.strip()
            self.files[path] = _lines(proc.stdout) if proc.returncode == 0 and kind == "blob" else None
        return self.files[path]


def _apply_change(patch: Patch, change: FileChange, overlay: _Overlay) -> None:
    def fail(message: str) -> PatchApplyError:
        return PatchApplyError(f"{patch.id} ({patch.file}) does not apply: {message}",
                               hint="the tree is not the one this patch was made for; "
                                    "rebase the patch and `patcher patches refresh`")

    if change.old_path is None:
        if overlay.get(change.new_path) is not None:
            raise fail(f"{change.new_path}: the patch creates it, but it already exists")
        content: list[str] = []
    else:
        existing = overlay.get(change.old_path)
        if existing is None:
            raise fail(f"{change.old_path}: no such file in the tree")
        content = existing
    result = list(content)
    # Hunks name lines of the file before this patch: check all, then splice from the end.
    for hunk in change.hunks:
        start = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
        for i, expected in enumerate(hunk.old_lines):
            found = content[start + i] if start + i < len(content) else None
            if found != expected:
                raise fail(f"{change.path}, hunk {hunk.header}: line {start + i + 1} expected "
                           f"{_describe(expected)}, found {_describe(found)}")
    for hunk in sorted(change.hunks, key=lambda h: h.old_start, reverse=True):
        start = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
        result[start:start + len(hunk.old_lines)] = hunk.new_lines
    if change.new_path is None:
        if result:
            raise fail(f"{change.old_path}: the patch deletes it, but it has other content")
        overlay.files[change.old_path] = None
    else:
        if change.old_path and change.old_path != change.new_path:
            overlay.files[change.old_path] = None
        overlay.files[change.new_path] = result


def _apply_in_memory(patches: list[Patch], tree: Path, reverse: bool = False) -> None:
    overlay = _Overlay(tree)
    for patch in patches:
        for change in patch.changes:
            _apply_change(patch, change.reversed() if reverse else change, overlay)


def _applied_prefix(patches: list[Patch], tree: Path) -> int:
    """k > 0 when the first k patches are in the tree and the rest apply on top, else 0."""
    for k in range(len(patches) - 1, 0, -1):
        try:
            _apply_in_memory(list(reversed(patches[:k])), tree, reverse=True)
            _apply_in_memory(patches[k:], tree)
        except PatchApplyError:
            continue
        return k
    return 0


# --- working trees ---------------------------------------------------------------------------
def _require_tree(tree: Path) -> Path:
    tree = Path(tree).absolute()
    proc = run_git("rev-parse", "--show-toplevel", cwd=tree, check=False) if tree.is_dir() else None
    if proc is None or proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != tree.resolve():
        raise PatchApplyError(f"{tree} is not the top of a git working tree",
                              hint="give --source the directory `patcher fetch` made")
    return tree


def _require_clean(tree: Path) -> None:
    status = run_git("status", "--porcelain", "--ignore-submodules=none", "--untracked-files=normal",
                     cwd=tree).stdout
    if status.strip():
        first = status.strip().splitlines()[0].strip()
        raise DirtyTreeError(f"{tree} has uncommitted changes ({first}"
                             f"{' and more' if len(status.strip().splitlines()) > 1 else ''})",
                             hint="commit or discard them (git stash / git checkout .) first")


def _head(tree: Path) -> str:
    return run_git("rev-parse", "HEAD", cwd=tree).stdout.strip()


def _refused(patch: Patch, file: str, why: str) -> HostilePatchError:
    return HostilePatchError(f"{patch.file} ({patch.id}): refused: {file}: {why}", hint=HOSTILE_HINT)


def _refuse_paths_through_the_tree(patches: list[Patch], tree: Path) -> None:
    """No path may lead through a symbolic link or a submodule of the tree, or be one."""
    paths = {p: patch for patch in reversed(patches) for c in patch.changes
             for p in (c.old_path, c.new_path) if p}
    wanted = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 2)}
    listed = run_git("ls-tree", "-z", "HEAD", "--", *sorted(wanted), cwd=tree,
                     env={"GIT_LITERAL_PATHSPECS": "1"}).stdout
    modes = {}
    for entry in listed.split("\0"):
        if entry:
            meta, _, name = entry.partition("\t")
            modes[name] = meta.split()[0]
    for path, patch in sorted(paths.items()):
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix, last = "/".join(parts[:i]), i == len(parts)
            mode = modes.get(prefix)
            on_disk = tree / prefix
            if mode == "120000" or on_disk.is_symlink():
                raise _refused(patch, path, "is a symbolic link in the tree" if last else
                               f"leads through the symbolic link {prefix} of the tree (outside the tree's own files)")
            if mode == "160000":
                raise _refused(patch, path, "is a submodule (gitlink) of the tree" if last else
                               f"lies inside the submodule {prefix} (a patch of the tree cannot change "
                               f"a submodule's files)")
            if last and mode == "040000":
                raise _refused(patch, path, "is a directory of the tree")


def _refuse_what_git_would_see(patch: Patch, tree: Path) -> None:
    """Ask git itself what `git am` would apply: it must be exactly the diff parsed here.

    One message (git mailsplit), the same patch text byte for byte (git mailinfo: no transfer
    encoding or split point that reads differently), and per file the same path and line counts
    with no mode, rename or copy (git apply --numstat / --summary).
    """
    with tempfile.TemporaryDirectory(prefix="patcher-mailsplit-") as tmp:
        work = Path(tmp)
        split = run_git("mailsplit", "--keep-cr", f"-o{work}", patch.path, cwd=tree, check=False)
        messages = sorted(p for p in work.iterdir())
        if split.returncode != 0 or len(messages) != 1:
            raise _refused(patch, "(the mbox)", f"git am would read {len(messages)} messages from it, not one")
        with open(messages[0], "rb") as mail:
            info = run_git("mailinfo", str(work / "msg"), str(work / "patch"), stdin=mail, cwd=tree, check=False)
        if info.returncode != 0:
            raise _refused(patch, "(the mbox)", f"git mailinfo cannot read it: {last_line(info.stderr)}")
        seen = (work / "patch").read_bytes().decode("utf-8", "surrogateescape")
        text = patch.text
        head_end = text.find("\n\n") + 2
        diff_at = re.search(r"^diff --git ", text[head_end:], re.M)
        separator = re.search(r"^---$", text[head_end:head_end + diff_at.start()], re.M) if diff_at else None
        expected = text[head_end + (separator or diff_at).start():] if diff_at else ""
        if seen != expected:
            raise _refused(patch, "(the mbox)", "git am would apply another text than the diff read here "
                                                "(a transfer encoding, or a patch break inside the message)")
        numstat = run_git("apply", "--numstat", "-z", str(work / "patch"), cwd=tree, check=False)
        summary = run_git("apply", "--summary", str(work / "patch"), cwd=tree, check=False)
    if numstat.returncode != 0 or summary.returncode != 0:
        raise _refused(patch, "(the mbox)", f"git apply cannot read it: {last_line(numstat.stderr + summary.stderr)}")
    ours = [f"{c.added}\t{c.removed}\t{c.new_path or c.old_path}" for c in patch.changes]
    git_sees = [e for e in numstat.stdout.split("\0") if e]
    if git_sees != ours:
        extra = [e.split("\t")[-1] for e in git_sees if e not in ours] or ["(a file)"]
        raise _refused(patch, extra[0], "git am would change it in another way than the diff read here shows")
    for line in summary.stdout.splitlines():
        words = line.split()
        if words[:2] in (["create", "mode"], ["delete", "mode"]) and \
                (words[2] == "100644" or (words[0] == "delete" and words[2] in REGULAR_MODES)):
            continue
        raise _refused(patch, words[-1] if words else "?", f"git am would make this change: {line.strip()!r}")


@reports_failures_as(PatchApplyError, "check failed")
def check_series(series: Series, tree: Path) -> CheckResult:
    """Check the whole series against a clean tree without touching it."""
    tree = _require_tree(tree)
    _require_clean(tree)
    patches = list(series.patches)
    for patch in patches:
        _refuse_what_git_would_see(patch, tree)
    _refuse_paths_through_the_tree(patches, tree)
    try:
        _apply_in_memory(patches, tree)
    except PatchApplyError as forward:
        try:
            _apply_in_memory(list(reversed(patches)), tree, reverse=True)
        except PatchApplyError:
            applied = _applied_prefix(patches, tree)
            if applied:
                ids = [p.id for p in patches]
                raise PatchApplyError(
                    f"the series of torch {series.version} is partly in {tree}: {', '.join(ids[:applied])} "
                    f"applied, {', '.join(ids[applied:])} not",
                    hint="reset the tree to its tag (git reset --hard) and apply the whole series") from None
            raise forward from None
        return CheckResult(series.version, len(patches), already_applied=True)
    return CheckResult(series.version, len(patches), already_applied=False)


def _message_trailers(tree: Path, commit: str) -> dict[str, str]:
    message = run_git("log", "-1", "--format=%B", commit, cwd=tree).stdout
    out = {}
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip("\n")) if p.strip()]
    if len(paragraphs) > 1:
        for line in paragraphs[-1].splitlines():
            m = TRAILER_RE.match(line)
            if m:
                out[m.group(1)] = m.group(2).strip()
    return out


def _series_commits(series: Series, tree: Path) -> list[str] | None:
    """The commits at HEAD that carry the series' Patch-Ids in order, or None."""
    n = len(series.patches)
    if n == 0:
        return []
    proc = run_git("rev-list", "--first-parent", f"--max-count={n}", "HEAD", cwd=tree, check=False)
    commits = list(reversed(proc.stdout.split()))
    if len(commits) != n:
        return None
    ids = [_message_trailers(tree, c).get("Patch-Id") for c in commits]
    return commits if ids == series.ids else None


@reports_failures_as(PatchApplyError, "apply failed")
def apply_series(series: Series, tree: Path) -> PatchedTree:
    """Apply the series as one commit per patch; on any failure reset to the starting commit."""
    tree = _require_tree(tree)
    check = check_series(series, tree)
    if check.already_applied:
        commits = _series_commits(series, tree)
        base = run_git("rev-parse", f"HEAD~{len(commits)}", cwd=tree).stdout.strip() if commits else None
        return PatchedTree(
            version=series.version, path=str(tree), base=base, head=_head(tree),
            patches=tuple(AppliedPatch(p.id, p.sha256, commits[i] if commits else None)
                          for i, p in enumerate(series.patches)),
            tree_hash=tree_hash(tree), already_applied=True)
    base = _head(tree)
    applied = []
    try:
        for patch in series.patches:
            name, mail = email.utils.parseaddr(patch.author)
            env = {"GIT_COMMITTER_NAME": name or mail, "GIT_COMMITTER_EMAIL": mail}
            try:
                run_git("am", "-q", "--committer-date-is-author-date", "--no-3way", "--keep-cr",
                        patch.path, cwd=tree, env=env)
            except GitCommandFailed as exc:
                raise PatchApplyError(f"{patch.id} ({patch.file}): git am failed: {last_line(exc.stderr)}",
                                      hint="the tree was reset to where it started") from None
            applied.append(AppliedPatch(patch.id, patch.sha256, _head(tree)))
    except BaseException:
        run_git("am", "--abort", cwd=tree, check=False)
        run_git("reset", "-q", "--hard", base, cwd=tree, check=False)
        run_git("clean", "-q", "-d", "-f", cwd=tree, check=False)
        raise
    return PatchedTree(version=series.version, path=str(tree), base=base, head=_head(tree),
                       patches=tuple(applied), tree_hash=tree_hash(tree))


# --- exporting commits into the catalog ------------------------------------------------------
def _format_patch(tree: Path, commit: str) -> bytes:
    text = run_git(*_FORMAT_PATCH, "-1", commit, cwd=tree).stdout
    return text.encode("utf-8", "surrogateescape")


def slug(subject: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    return words[:52].rstrip("-") or "patch"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@reports_failures_as(PatchFormatError, "export failed")
def new_patches(patches_dir: Path, version: str, tree: Path, revrange: str,
                dry_run: bool = False) -> list[Patch]:
    """Export the commits of ``revrange`` as catalog patches and append them to the series."""
    tree = _require_tree(tree)
    directory = Path(patches_dir) / version
    existing = load_series(patches_dir, version) if (directory / "series").is_file() else None
    proc = run_git("rev-list", "--reverse", "--no-merges", revrange, cwd=tree, check=False)
    if proc.returncode != 0:
        raise PatchNotFoundError(f"cannot read commits {revrange} in {tree}: {last_line(proc.stderr)}")
    commits = proc.stdout.split()
    if not commits:
        raise PatchNotFoundError(f"{revrange} names no commits in {tree}", hint="the range is A..B, A excluded")
    taken = {p.id: p.file for p in existing.patches} if existing else {}
    made: list[tuple[Patch, bytes]] = []
    for commit in commits:
        data = _format_patch(tree, commit)
        short = commit[:12]
        subject = run_git("log", "-1", "--format=%s", commit, cwd=tree).stdout.strip()
        try:
            patch = parse_patch(data, f"commit {short} ({subject})", version)
        except PatchFormatError as exc:
            raise PatchFormatError(exc.message, hint="put the trailers at the end of the commit message "
                                   "(git commit --amend) and export again") from None
        name = f"{patch.id[3:]}-{slug(patch.subject)}.patch"
        if patch.id in taken:
            raise PatchFormatError(f"commit {short}: Patch-Id {patch.id} is already used by {taken[patch.id]}",
                                   hint="pick a new Patch-Id, or `patcher patches refresh` to update it")
        if (directory / name).exists():
            raise PatchFormatError(f"commit {short}: {directory / name} already exists")
        taken[patch.id] = name
        made.append((Patch(**{**asdict_shallow(patch), "file": name, "path": str(directory / name)}), data))
    if dry_run:
        return [p for p, _ in made]
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        for patch, data in made:
            _write_atomic(Path(patch.path), data)
            written.append(Path(patch.path))
        series_file = directory / "series"
        old = series_file.read_text(encoding="utf-8") if series_file.is_file() else \
            f"# Patch series for PyTorch {version}, applied in this order (quilt style).\n"
        if old and not old.endswith("\n"):
            old += "\n"
        _write_atomic(series_file, (old + "".join(f"{p.file}\n" for p, _ in made)).encode("utf-8"))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return [p for p, _ in made]


def asdict_shallow(patch: Patch) -> dict[str, Any]:
    return {f: getattr(patch, f) for f in patch.__dataclass_fields__}


@reports_failures_as(PatchFormatError, "refresh failed")
def refresh_series(patches_dir: Path, version: str, tree: Path, dry_run: bool = False) -> list[RefreshChange]:
    """Re-export each patch of the series from its commit at HEAD (after the commits were edited)."""
    tree = _require_tree(tree)
    _require_clean(tree)
    series = load_series(patches_dir, version)
    n = len(series.patches)
    commits = list(reversed(run_git("rev-list", "--first-parent", f"--max-count={n}", "HEAD",
                                    cwd=tree).stdout.split()))
    found = [_message_trailers(tree, c).get("Patch-Id") for c in commits]
    if found != series.ids:
        raise PatchNotFoundError(
            f"the last {len(commits)} commit(s) of {tree} carry {', '.join(i or 'no Patch-Id' for i in found)}, "
            f"but the series of torch {version} is {', '.join(series.ids)}",
            hint="apply the series with `patcher patches apply`, edit its commits in place, then refresh")
    outputs: list[tuple[Patch, bytes, RefreshChange]] = []
    for patch, commit in zip(series.patches, commits):
        data = _format_patch(tree, commit)
        fresh = parse_patch(data, f"{patch.file} (from commit {commit[:12]})", version)
        if fresh.id != patch.id:
            raise PatchFormatError(f"commit {commit[:12]} changed its Patch-Id from {patch.id} to {fresh.id}")
        new_sha = hashlib.sha256(data).hexdigest()
        outputs.append((patch, data, RefreshChange(patch.id, patch.file, new_sha != patch.sha256,
                                                   patch.sha256, new_sha)))
    if not dry_run:
        for patch, data, change in outputs:
            if change.changed:
                _write_atomic(Path(patch.path), data)
    return [c for _, _, c in outputs]
