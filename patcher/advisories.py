"""Advisories: every published torch advisory, and what it means for one wheel.

The data is ``patcher/data/advisories.toml`` (its header says what each field means), plus an
optional site file that adds advisories or overrides assessments.  :func:`load` reads and
validates both; :func:`assess` turns them, a build's flags, its patch series and (when there
is one) its probe report into one :class:`Finding` per advisory; :func:`check_tree` checks the
claims that rest on source (``code_not_present``, ``requires_configuration``) against a real
tree, or against the files of a release's wheel (an assessment's ``wheel``: PyPI's wheel, where no
tree of the release is reachable).  Nothing here guesses: a release without an assessment is
``in_triage``.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from patcher.errors import AdvisoryClaimError, AdvisoryDataError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA_FILE = Path(__file__).resolve().parent / "data" / "advisories.toml"

STATES = ("resolved", "not_affected", "exploitable", "in_triage", "false_positive")
ASSESSED_STATES = ("resolved", "not_affected", "exploitable", "in_triage")
JUSTIFICATIONS = ("code_not_present", "requires_configuration")
OFF_VALUES = {"0", "off", "false", "no"}
_ADVISORY_KEYS = {"id", "aliases", "title", "summary", "component", "published", "withdrawn", "cvss", "ranges",
                  "fixes", "references", "records", "unread", "assess"}
_ASSESS_KEYS = {"state", "detail", "patch", "probes", "justification", "requires", "guards", "present", "absent",
                "absent_text", "otherwise_state", "otherwise_detail", "by", "wheel"}
_CVSS_RE = re.compile(r"^CVSS:(3\.1|3\.0|4\.0)/[A-Z]+:[A-Z]")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*")


# --------------------------------------------------------------------------------------------
# the data
@dataclass(frozen=True)
class Cvss:
    version: str
    vector: str
    score: float
    source: str

    @property
    def severity(self) -> str:
        s = self.score
        return ("none" if s == 0 else "low" if s < 4 else "medium" if s < 7 else "high" if s < 9 else "critical")


@dataclass(frozen=True)
class Assessment:
    release: str
    state: str
    detail: str = ""
    patch: str | None = None
    probes: tuple[str, ...] = ()
    justification: str | None = None
    requires: tuple[str, ...] = ()
    guards: tuple[Mapping[str, str], ...] = ()
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    absent_text: tuple[Mapping[str, str], ...] = ()
    otherwise_state: str | None = None
    otherwise_detail: str = ""
    origin: str = "patcher"
    wheel: Mapping[str, str] | None = None   # {file, sha256}: the claims were checked in this wheel's files


@dataclass(frozen=True)
class Advisory:
    id: str
    title: str
    summary: str
    aliases: tuple[str, ...] = ()
    component: str = ""
    published: str = ""
    withdrawn: str = ""
    cvss: tuple[Cvss, ...] = ()
    ranges: tuple[Mapping[str, Any], ...] = ()
    fixes: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    records: tuple[Mapping[str, str], ...] = ()
    unread: tuple[str, ...] = ()
    assess: Mapping[str, Assessment] = field(default_factory=dict)

    @property
    def score(self) -> float | None:
        """The highest published base score (any CVSS version), None when none was published."""
        return max((c.score for c in self.cvss), default=None)

    @property
    def ghsa(self) -> str | None:
        return next((a for a in self.aliases if a.startswith("GHSA-")), None)

    @property
    def pysec(self) -> str | None:
        return next((a for a in self.aliases if a.startswith("PYSEC-")), None)


@dataclass(frozen=True)
class AdvisoryData:
    advisories: tuple[Advisory, ...]
    sources: tuple[tuple[str, str], ...]   # (path, sha256) of every file read, patcher's first

    def by_id(self) -> dict[str, Advisory]:
        return {a.id: a for a in self.advisories}


def _read_toml(path: Path, what: str) -> tuple[dict[str, Any], str]:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise AdvisoryDataError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise AdvisoryDataError(f"{what} {path} cannot be read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AdvisoryDataError(f"{what} {path} is not valid TOML: {exc}") from None
    if data.get("schema") != 1:
        raise AdvisoryDataError(f"{what} {path} is not a schema 1 advisories file")
    return data, hashlib.sha256(raw).hexdigest()


def _strs(value: Any, where: str, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AdvisoryDataError(f"{where}: {name} must be a list of strings")
    return tuple(value)


def _tables(value: Any, where: str, name: str, keys: set[str]) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise AdvisoryDataError(f"{where}: {name} must be a list of tables")
    for item in value:
        missing = keys - set(item)
        if missing:
            raise AdvisoryDataError(f"{where}: an entry of {name} lacks {', '.join(sorted(missing))}")
    return tuple(value)


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _wheel_source(value: Any, where: str) -> dict[str, str] | None:
    """``wheel = {file, sha256}``: the wheel whose files back a code_not_present claim."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"file", "sha256"}:
        raise AdvisoryDataError(f"{where}: wheel must be a table of file and sha256")
    name, digest = value["file"], value["sha256"]
    if not isinstance(name, str) or not name.endswith(".whl") or "/" in name:
        raise AdvisoryDataError(f"{where}: wheel.file must be a wheel's file name")
    if not isinstance(digest, str) or not _SHA256_RE.match(digest):
        raise AdvisoryDataError(f"{where}: wheel.sha256 must be 64 lowercase hex digits")
    return {"file": name, "sha256": digest}


def parse_assessment(raw: Any, where: str, release: str, origin: str) -> Assessment:
    if not isinstance(raw, dict):
        raise AdvisoryDataError(f"{where}: the assessment must be a table")
    unknown = set(raw) - _ASSESS_KEYS
    if unknown:
        raise AdvisoryDataError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                                hint=f"known: {', '.join(sorted(_ASSESS_KEYS))}")
    state = raw.get("state")
    if state not in ASSESSED_STATES:
        raise AdvisoryDataError(f"{where}: state {state!r} is not one of {', '.join(ASSESSED_STATES)}")
    detail = raw.get("detail", "")
    if not isinstance(detail, str):
        raise AdvisoryDataError(f"{where}: detail must be a string")
    a = Assessment(
        release=release, state=state, detail=detail, patch=raw.get("patch"),
        probes=_strs(raw.get("probes"), where, "probes"), justification=raw.get("justification"),
        requires=_strs(raw.get("requires"), where, "requires"),
        guards=_tables(raw.get("guards"), where, "guards", {"file", "condition", "line"}),
        present=_strs(raw.get("present"), where, "present"), absent=_strs(raw.get("absent"), where, "absent"),
        absent_text=_tables(raw.get("absent_text"), where, "absent_text", {"file", "text"}),
        otherwise_state=raw.get("otherwise_state"), otherwise_detail=raw.get("otherwise_detail", ""),
        origin=origin, wheel=_wheel_source(raw.get("wheel"), where))
    if origin != "patcher" and not raw.get("by"):
        raise AdvisoryDataError(f"{where}: a site's assessment must say who made it (by = ...)")
    if state == "resolved" and (not a.patch or not a.probes):
        raise AdvisoryDataError(f"{where}: a resolved assessment needs the patch (Patch-Id) and its probes")
    if state in ("exploitable", "in_triage") and not detail:
        raise AdvisoryDataError(f"{where}: a {state} assessment needs a detail saying why")
    if state == "not_affected":
        if a.justification not in JUSTIFICATIONS:
            raise AdvisoryDataError(f"{where}: not_affected needs a justification, one of {', '.join(JUSTIFICATIONS)}")
        if a.justification == "code_not_present" and not (a.absent or a.absent_text):
            raise AdvisoryDataError(f"{where}: code_not_present needs the evidence to check (absent or absent_text)")
        if a.justification == "requires_configuration":
            if not a.requires or not a.guards:
                raise AdvisoryDataError(f"{where}: requires_configuration needs the flags (requires) and the "
                                        "build guards that show it (guards)")
            if a.otherwise_state not in ("exploitable", "in_triage"):
                raise AdvisoryDataError(f"{where}: requires_configuration needs otherwise_state "
                                        "(exploitable or in_triage) for a build with the flags on")
            if not a.otherwise_detail:
                raise AdvisoryDataError(f"{where}: requires_configuration needs otherwise_detail")
    elif a.justification:
        raise AdvisoryDataError(f"{where}: a justification belongs to a not_affected assessment only")
    if a.wheel is not None and a.justification != "code_not_present":
        raise AdvisoryDataError(f"{where}: wheel backs code_not_present claims only")
    return a


def _parse_advisory(raw: Any, where: str, origin: str) -> Advisory:
    if not isinstance(raw, dict):
        raise AdvisoryDataError(f"{where}: an advisory must be a table")
    ident = raw.get("id")
    if not isinstance(ident, str) or not ident:
        raise AdvisoryDataError(f"{where}: an advisory lacks its id")
    where = f"{where} {ident}"
    unknown = set(raw) - _ADVISORY_KEYS
    if unknown:
        raise AdvisoryDataError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                                hint=f"known: {', '.join(sorted(_ADVISORY_KEYS))}")
    for key in ("title", "summary"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise AdvisoryDataError(f"{where}: {key} is missing")
    cvss = []
    for entry in _tables(raw.get("cvss"), where, "cvss", {"version", "vector", "score", "source"}):
        vector, score = entry["vector"], entry["score"]
        m = _CVSS_RE.match(str(vector))
        if not m or m.group(1) != str(entry["version"]):
            raise AdvisoryDataError(f"{where}: CVSS vector {vector!r} is not a CVSS {entry['version']} vector")
        if not isinstance(score, (int, float)) or not 0 <= score <= 10:
            raise AdvisoryDataError(f"{where}: CVSS score {score!r} is not a number from 0 to 10")
        cvss.append(Cvss(version=str(entry["version"]), vector=vector, score=float(score), source=str(entry["source"])))
    assess_raw = raw.get("assess", {})
    if not isinstance(assess_raw, dict):
        raise AdvisoryDataError(f"{where}: assess must be a table keyed by torch release")
    assess = {rel: parse_assessment(a, f"{where} assess {rel}", rel, origin) for rel, a in assess_raw.items()}
    return Advisory(
        id=ident, title=raw["title"], summary=raw["summary"], aliases=_strs(raw.get("aliases"), where, "aliases"),
        component=str(raw.get("component", "")), published=str(raw.get("published", "")),
        withdrawn=str(raw.get("withdrawn", "")), cvss=tuple(cvss),
        ranges=_tables(raw.get("ranges"), where, "ranges", {"source", "introduced"}),
        fixes=_strs(raw.get("fixes"), where, "fixes"), references=_strs(raw.get("references"), where, "references"),
        records=_tables(raw.get("records"), where, "records", {"id", "read"}),
        unread=_strs(raw.get("unread"), where, "unread"), assess=assess)


def load(path: Path | None = None, site: Path | None = None) -> AdvisoryData:
    """The advisories (``path``: default the packaged data) with a site's file laid over them."""
    path = Path(path) if path is not None else DATA_FILE
    data, digest = _read_toml(path, "advisories file")
    entries = data.get("advisory", [])
    if not isinstance(entries, list) or not entries:
        raise AdvisoryDataError(f"advisories file {path} holds no [[advisory]] tables")
    advisories: dict[str, Advisory] = {}
    for raw in entries:
        adv = _parse_advisory(raw, f"advisories file {path.name}:", "patcher")
        if adv.id in advisories:
            raise AdvisoryDataError(f"advisories file {path.name}: {adv.id} is listed twice")
        advisories[adv.id] = adv
    sources = [(str(path), digest)]
    if site is not None:
        _overlay(advisories, Path(site), sources)
    return AdvisoryData(advisories=tuple(advisories[k] for k in sorted(advisories)), sources=tuple(sources))


def _overlay(advisories: dict[str, Advisory], site: Path, sources: list[tuple[str, str]]) -> None:
    data, digest = _read_toml(site, "site advisories file")
    origin = f"site:{site.name}"
    unknown = set(data) - {"schema", "advisory", "assess"}
    if unknown:
        raise AdvisoryDataError(f"site advisories file {site}: unknown key(s) {', '.join(sorted(unknown))}",
                                hint="a site file holds [[advisory]] tables and [assess.\"<id>\".\"<torch>\"] tables")
    for raw in data.get("advisory", []):
        adv = _parse_advisory(raw, f"site advisories file {site.name}:", origin)
        if adv.id in advisories:
            raise AdvisoryDataError(f"site advisories file {site.name}: {adv.id} is already in patcher's data",
                                    hint="override its assessment with [assess.\"<id>\".\"<torch>\"] instead")
        advisories[adv.id] = adv
    overrides = data.get("assess", {})
    if not isinstance(overrides, dict):
        raise AdvisoryDataError(f"site advisories file {site.name}: assess must be a table")
    for ident, per_release in overrides.items():
        if ident not in advisories:
            raise AdvisoryDataError(f"site advisories file {site.name}: assess names {ident}, which no advisory has",
                                    hint="add the advisory as an [[advisory]] table first")
        if not isinstance(per_release, dict):
            raise AdvisoryDataError(f"site advisories file {site.name}: assess.{ident} must be a table of releases")
        adv = advisories[ident]
        merged = dict(adv.assess)
        for rel, raw in per_release.items():
            merged[rel] = parse_assessment(raw, f"site advisories file {site.name}: {ident} assess {rel}", rel, origin)
        advisories[ident] = Advisory(**{**adv.__dict__, "assess": merged})
    sources.append((str(site), digest))


# --------------------------------------------------------------------------------------------
# one wheel
@dataclass(frozen=True)
class Finding:
    advisory: Advisory
    state: str                  # one of STATES
    detail: str
    basis: str                  # assessment | range | withdrawn | none
    justification: str | None = None
    patch: str | None = None
    probes: tuple[str, ...] = ()
    origin: str = "patcher"

    def row(self) -> dict[str, Any]:
        a = self.advisory
        return {"id": a.id, "aliases": list(a.aliases), "title": a.title, "score": a.score,
                "severity": a.cvss[0].severity if a.cvss else "unknown",
                "state": self.state, "justification": self.justification, "patch": self.patch,
                "probes": list(self.probes), "basis": self.basis, "detail": self.detail, "origin": self.origin}


_PATCH_ID_RE = re.compile(r"^Patch-Id:\s*(\S+)\s*$", re.M)


def series_patch_ids(patches_dir: Path, torch: str) -> list[str]:
    """The Patch-Ids of ``patches/<torch>/series`` in order ([] when the release has no series).

    Only the trailer is read: the catalog's own validation is `patcher patches check`'s job.
    """
    directory = Path(patches_dir) / torch
    try:
        lines = (directory / "series").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    ids = []
    for line in lines:
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            m = _PATCH_ID_RE.search((directory / name).read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            raise AdvisoryDataError(f"the series of torch {torch} lists {name}, which does not exist") from None
        if m is None:
            raise AdvisoryDataError(f"{directory / name} has no Patch-Id trailer")
        ids.append(m.group(1))
    return ids


def build_flags(spec: Any) -> dict[str, str]:
    """The build's feature flags: USE_CUDA from the spec, then its build environment."""
    flags = {"USE_CUDA": "0" if spec.is_cpu else "1"}
    flags.update({k: str(v) for k, v in spec.build_env.items()})
    return flags


def flag_is_off(flags: Mapping[str, str], name: str) -> bool:
    # A flag the build leaves unset keeps PyTorch's default, which is on for every flag used here.
    return str(flags.get(name, "1")).strip().lower() in OFF_VALUES


def _release_version(text: str) -> Version | None:
    m = _VERSION_RE.match(str(text))
    if not m:
        return None
    try:
        return Version(m.group(0))
    except InvalidVersion:
        return None


def _before_every_range(adv: Advisory, torch: str) -> str | None:
    """The earliest introduced version when every published range starts after ``torch``."""
    release = _release_version(torch)
    if release is None or not adv.ranges:
        return None
    starts = [_release_version(r.get("introduced", "0")) for r in adv.ranges]
    if any(s is None or s == Version("0") or s <= release for s in starts):
        return None
    return str(min(starts))


def assess(data: AdvisoryData, torch: str, flags: Mapping[str, str], patch_ids: Iterable[str],
           probe_checks: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """One finding per advisory for a wheel of ``torch`` built with ``flags`` and ``patch_ids``.

    ``probe_checks`` (check id -> the probe report's entry) is the wheel's probe report; None
    before any build, when a resolved state says what the series will carry.
    """
    carried = set(patch_ids)
    out = []
    for adv in data.advisories:
        a = adv.assess.get(torch)
        if adv.withdrawn:
            out.append(Finding(adv, "false_positive", f"withdrawn: {adv.withdrawn}", "withdrawn"))
        elif a is None:
            start = _before_every_range(adv, torch)
            if start is not None:
                out.append(Finding(adv, "not_affected", f"every published range starts at {start} or later "
                                   "(the records' own ranges; no source check)", "range"))
            else:
                out.append(Finding(adv, "in_triage", f"not assessed for torch {torch}", "none"))
        else:
            out.append(_apply(adv, a, flags, carried, probe_checks))
    return out


def _apply(adv: Advisory, a: Assessment, flags: Mapping[str, str], carried: set[str],
           probe_checks: Mapping[str, Mapping[str, Any]] | None) -> Finding:
    base = {"basis": "assessment", "origin": a.origin}
    if a.state == "not_affected" and a.justification == "requires_configuration":
        off = [f for f in a.requires if flag_is_off(flags, f)]
        if off:
            return Finding(adv, "not_affected", f"{a.detail}; this build has {', '.join(f'{f}=0' for f in off)}",
                           justification="requires_configuration", **base)
        return Finding(adv, str(a.otherwise_state), f"built with {', '.join(a.requires)} on: {a.otherwise_detail}",
                       **base)
    if a.state == "resolved":
        if a.patch not in carried:
            return Finding(adv, "exploitable", f"{a.patch} fixes it but this build does not carry it",
                           patch=a.patch, probes=a.probes, **base)
        if probe_checks is not None:
            seen = [(p, probe_checks.get(p)) for p in a.probes]
            failed = [f"{p}: {(c or {}).get('status', 'not run')}" for p, c in seen
                      if c is None or c.get("status") not in ("pass", "skip")]
            if failed:
                return Finding(adv, "in_triage", f"carries {a.patch}, but its probe report does not show the "
                               f"fix working ({'; '.join(failed)})", patch=a.patch, probes=a.probes, **base)
            skipped = [f"{p} skipped ({c.get('message', '')})" for p, c in seen if c.get("status") == "skip"]
            detail = a.detail + (f"; {', '.join(skipped)}" if skipped else "")
            return Finding(adv, "resolved", detail, patch=a.patch, probes=a.probes, **base)
        return Finding(adv, "resolved", a.detail, patch=a.patch, probes=a.probes, **base)
    detail = a.detail
    if a.wheel is not None:
        # the evidence says where it was checked: no tree of this release, the published wheel's files
        detail += f" (checked against the files of the wheel {a.wheel['file']}, sha256 {a.wheel['sha256']})"
    return Finding(adv, a.state, detail, justification=a.justification, probes=a.probes, **base)


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    out = {s: 0 for s in STATES}
    for f in findings:
        out[f.state] += 1
    return out


# --------------------------------------------------------------------------------------------
# claims that rest on source, checked against a real tree
@dataclass(frozen=True)
class ClaimResult:
    advisory: str
    release: str
    claim: str
    ok: bool
    why: str


def _inside_guard(lines: list[str], condition: str, target: str) -> tuple[bool, str]:
    """Whether the first line holding ``target`` sits in the true branch of a ``condition`` block."""
    stack: list[tuple[str, bool]] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        low = line.lower().replace(" ", "")
        if target in line:
            guarded = any(cond == condition and not in_else for cond, in_else in stack)
            return guarded, (f"line {number} is inside {condition}" if guarded else
                             f"line {number} is not inside {condition}")
        if low.startswith("if("):
            stack.append((line, False))
        elif low.startswith(("elseif(", "else(")) and stack:
            stack[-1] = (stack[-1][0], True)
        elif low.startswith("endif(") and stack:
            stack.pop()
    return False, f"no line holds {target!r}"


class _TreeFiles:
    """A source tree's files, by path relative to its root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def text(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


class _WheelFiles:
    """A wheel's files, by path relative to site-packages: the same paths as a tree's for the
    Python package (``torch/serialization.py``)."""

    def __init__(self, wheel: Path) -> None:
        self.name = wheel.name
        try:
            with wheel.open("rb") as fh:
                digest = hashlib.sha256()
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            self.sha256 = digest.hexdigest()
            self.zip = zipfile.ZipFile(wheel)
        except (OSError, zipfile.BadZipFile) as exc:
            raise AdvisoryClaimError(f"wheel {wheel} cannot be read as a zip archive: {exc}") from None
        self.files = set(self.zip.namelist())
        self.dirs = {name.rsplit("/", i)[0] for name in self.files for i in range(1, name.count("/") + 1)}

    def exists(self, rel: str) -> bool:
        rel = rel.rstrip("/")
        return rel in self.files or rel in self.dirs

    def text(self, rel: str) -> str | None:
        if rel not in self.files:
            return None
        return self.zip.read(rel).decode("utf-8", errors="replace")


def check_tree(data: AdvisoryData, torch: str, tree: Path) -> list[ClaimResult]:
    """Check every source-based claim of ``torch``'s assessments against the tree at ``tree``,
    or against the files of the wheel ``tree`` (a ``.whl`` file).  An assessment that names the
    wheel it was established on is checked only against that wheel (same name and sha256)."""
    tree = Path(tree)
    wheel = tree.suffix == ".whl" and tree.is_file()
    if not wheel and not tree.is_dir():
        raise AdvisoryClaimError(f"no source tree or wheel at {tree}")
    files: _TreeFiles | _WheelFiles = _WheelFiles(tree) if wheel else _TreeFiles(tree)
    results = []
    for adv in data.advisories:
        a = adv.assess.get(torch)
        if a is None or a.state != "not_affected":
            continue

        def add(claim: str, ok: bool, why: str, _adv: Advisory = adv) -> None:
            results.append(ClaimResult(_adv.id, torch, claim, ok, why))

        if a.wheel is not None:
            source = (files.name, files.sha256) if isinstance(files, _WheelFiles) else None
            if source != (a.wheel["file"], a.wheel["sha256"]):
                add(f"checked in {a.wheel['file']} sha256 {a.wheel['sha256']}", False,
                    f"this is {source[0]} sha256 {source[1]}" if source else "this is a tree, not that wheel")
                continue
        for rel in a.absent:
            add(f"absent {rel}", not files.exists(rel), "absent" if not files.exists(rel) else "present")
        for item in a.absent_text:
            text = files.text(item["file"])
            ok = text is not None and item["text"] not in text
            add(f"{item['file']} lacks {item['text']!r}", ok,
                "no such file" if text is None else ("not found" if ok else "found"))
        for rel in a.present:
            add(f"present {rel}", files.exists(rel), "present" if files.exists(rel) else "absent")
        for guard in a.guards:
            text = files.text(guard["file"])
            if text is None:
                add(f"{guard['file']}: {guard['line']!r} inside {guard['condition']}", False, "no such file")
                continue
            ok, why = _inside_guard(text.splitlines(), guard["condition"], guard["line"])
            add(f"{guard['file']}: {guard['line']!r} inside {guard['condition']}", ok, why)
    return results
