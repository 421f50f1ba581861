"""Report stage: a wheel's signed evidence -> one self-contained HTML page (and a PDF) for an auditor.

``patcher report WHEEL|BUILD_DIR|EVIDENCE_DIR`` reads only what certify signed: the DSSE-signed
statement (``W.intoto.jsonl``), and the files it binds by digest (the SBOM, the probe report, a
VEX when one is there).  Each patch's subject and trailers are the ones the statement signs (certify
records them); for older evidence they are read from a catalog file, or a version of it in the
catalog's git history, whose sha256 is the signed one.  Every check is made again here and printed
on top, and the verdict is the worst of them (``verdict_of``, ``VERDICT_RULE``): the evidence's
integrity, each patch's own probe checks, the signed VEX's advisories.  A target whose wheel is gone
(a recorded run keeps only the evidence) is reported from the evidence, the wheel's digest unchecked.

The page carries its style and its chart inline: no script, no font, no image, no request leaves
it.  The PDF is the same page printed by headless Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patcher import evidence, sbom
from patcher.errors import EvidenceFormatError, PatcherError, ReportRenderError, ReportTargetError

REPORT_SUFFIX = ".report.html"
VEX_SUFFIX = ".vex.json"
TEMPLATE = "report.html.j2"


# --------------------------------------------------------------------------------------------
# what the page says
@dataclass
class Check:
    name: str
    status: str            # ok | failed | absent | skipped | unproven | open
    detail: str = ""


@dataclass
class ReportData:
    wheel: str
    wheel_sha256: str
    verdict: str           # verified | incomplete (nothing failed, something not proven) | failed (verdict_of)
    checks: list[Check]
    keyid: str
    statement: dict[str, Any]
    spec: dict[str, Any]
    source: dict[str, Any]
    submodules: list[dict[str, Any]]
    overrides: list[dict[str, str]]
    patches: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    image_packages: int
    probe: dict[str, Any] | None
    probe_checks: list[dict[str, Any]]
    sbom_summary: sbom.SbomSummary | None
    vex: list[dict[str, Any]] | None
    reproducibility: dict[str, str]
    commands: list[tuple[str, str]]
    build: dict[str, Any] = field(default_factory=dict)
    image_package_list: list[dict[str, str]] = field(default_factory=list)
    wheel_gone: str = ""   # where the wheel was looked for, when it is not there
    rule: str = ""         # the verdict's rule, printed under it


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvidenceFormatError(f"{what} {path.name} cannot be read as JSON: {exc}") from None


@dataclass(frozen=True)
class Located:
    """Where a target's evidence is: ``wheel`` is the wheel's path (its evidence lies beside it, the
    wheel itself may be gone); ``gone`` says, when the wheel is not there, where it was looked for."""

    wheel: Path
    gone: str = ""


def _provenances(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.whl" + evidence.PROVENANCE_SUFFIX))


def _wheel_of(provenance: Path) -> Path:
    return provenance.with_name(provenance.name[: -len(evidence.PROVENANCE_SUFFIX)])


def locate(target: Path) -> Located:
    """The wheel a target names: a wheel, a build directory (record.json), a folder holding one wheel's
    evidence, or a folder one of whose sub-folders does (a recorded run keeps it in ``evidence/``)."""
    target = Path(target)
    if target.suffix == ".whl":
        if not target.with_name(target.name + evidence.PROVENANCE_SUFFIX).is_file():
            raise ReportTargetError(f"no provenance {target.name}{evidence.PROVENANCE_SUFFIX} beside {target}",
                                    hint="run `patcher certify` for this build first")
        return Located(target, "" if target.is_file() else f"{target.name} is not in {target.parent}")
    if not target.is_dir():
        raise ReportTargetError(f"{target} is neither a wheel nor a directory")
    record = target / "record.json"
    if record.is_file():
        data = _read_json(record, "build record")
        data = data if isinstance(data, dict) else {}
        path = (data.get("wheel") or {}).get("path")
        if not path:
            raise ReportTargetError(f"build record {record} names no wheel: the build has not finished")
        wheel = Path(path) if Path(path).is_absolute() else target / path
        signed = (data.get("evidence") or {}).get("provenance")
        if not wheel.with_name(wheel.name + evidence.PROVENANCE_SUFFIX).is_file() and signed:
            wheel = _wheel_of(Path(signed) if Path(signed).is_absolute() else target / signed)
        return locate(wheel)
    found = _provenances(target)
    if not found:
        # one level down: a recorded run or a build folder keeps its evidence in a sub-folder
        found = [p for sub in sorted(target.iterdir()) if sub.is_dir() for p in _provenances(sub)]
    if len(found) != 1:
        names = ", ".join(str(p.relative_to(target)) for p in found[:4]) or "none"
        raise ReportTargetError(f"{target} holds {len(found)} wheels' signed evidence, not one ({names})",
                                hint="give the wheel, or the folder that holds one wheel's *.intoto.jsonl")
    wheel = _wheel_of(found[0])
    return Located(wheel, "" if wheel.is_file() else f"{wheel.name} is not in {wheel.parent}")


def find_wheel(target: Path) -> Path:
    """The wheel path a target names (it may be gone; its evidence is beside that path)."""
    return locate(target).wheel


def _unverified_statement(wheel: Path) -> dict[str, Any]:
    lines = wheel.with_name(wheel.name + evidence.PROVENANCE_SUFFIX).read_text(encoding="utf-8").splitlines()
    for line in lines:
        try:
            payload = base64.b64decode(json.loads(line)["payload"])
            statement = json.loads(payload)
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(statement, dict) and statement.get("predicateType") == evidence.PROVENANCE_TYPE:
            return statement
    raise EvidenceFormatError(f"{wheel.name}{evidence.PROVENANCE_SUFFIX} holds no readable provenance statement")


def _byproduct(predicate: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for item in (predicate.get("runDetails") or {}).get("byproducts") or []:
        if isinstance(item, dict) and (item.get("annotations") or {}).get("kind") == kind:
            return item
    return None


def _checked_file(wheel: Path, item: dict[str, Any] | None, what: str, checks: list[Check],
                  required: bool = True) -> Path | None:
    if item is None:
        if required:
            checks.append(Check(what, "failed", "the signed statement records none"))
        return None
    try:
        path = evidence._check_beside(wheel, item, what)
    except EvidenceFormatError as exc:
        checks.append(Check(what, "failed", str(exc)))
        return None
    checks.append(Check(what, "ok", f"{path.name}: sha256 {item['digest']['sha256'][:16]}… as signed"))
    return path


class CatalogByContent:
    """The catalog's patch files of one release, found by sha256 only (trust by content): the files
    in ``patches/<torch>/`` and, when the catalog is a git work tree, every version of them in its
    history (a build recorded against an older catalog still finds the bytes it signed)."""

    def __init__(self, catalog: Path | None, torch: str) -> None:
        self.catalog = Path(catalog) if catalog is not None else None
        self.torch = torch
        self._files: dict[str, tuple[str, bytes]] | None = None
        self._history: dict[str, tuple[str, bytes]] | None = None

    def find(self, sha256: str, names: set[str]) -> tuple[str, bytes] | None:
        """(where it was found, its bytes) for the file with this sha256, or None."""
        if self.catalog is None:
            return None
        if self._files is None:
            self._files = {}
            folder = self.catalog / "patches" / self.torch
            for path in sorted(folder.glob("*.patch")) if folder.is_dir() else []:
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                self._files[hashlib.sha256(data).hexdigest()] = (f"catalog file {path.name}", data)
        if sha256 in self._files:
            return self._files[sha256]
        if self._history is None:
            self._history = self._read_history(names)
        return self._history.get(sha256)

    def _read_history(self, names: set[str]) -> dict[str, tuple[str, bytes]]:
        from patcher.gitrun import GitCommandFailed, run_git

        folder = f"patches/{self.torch}/"
        found: dict[str, tuple[str, bytes]] = {}
        if shutil.which("git") is None or not (self.catalog / "patches" / self.torch).is_dir():
            return found
        try:
            if run_git("rev-parse", "--is-inside-work-tree", cwd=self.catalog, check=False).returncode != 0:
                return found
            log = run_git("log", "--format=commit %H", "--raw", "--no-abbrev", "--no-renames", "--", folder,
                          cwd=self.catalog, check=False).stdout
            blobs: dict[str, tuple[str, str]] = {}
            commit = ""
            for line in log.splitlines():
                if line.startswith("commit "):
                    commit = line.split()[1]
                elif line.startswith(":") and "\t" in line:
                    fields_, path = line.split("\t", 1)
                    blob = fields_.split()[3]
                    if Path(path).name in names and set(blob) != {"0"}:
                        blobs.setdefault(blob, (commit, Path(path).name))
            for blob, (commit, name) in blobs.items():
                shown = run_git("cat-file", "blob", blob, cwd=self.catalog, check=False)
                data = shown.stdout.encode("utf-8", "surrogateescape")
                # the bytes are trusted only by their sha256, so a decoding slip cannot mislead: it misses
                found.setdefault(hashlib.sha256(data).hexdigest(),
                                 (f"{name} as of the catalog's commit {commit[:12]}", data))
        except (GitCommandFailed, OSError, ValueError, IndexError):
            return found
        return found


_PASSED = "pass"


def _patch_rows(deps: list[dict[str, Any]], catalog: Path | None, torch: str,
                probe_checks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Check, Check]:
    """The patch table from the signed statement: Patch-Id, file and sha256 as signed; subject and
    trailers as signed (certify records them), else from a catalog file with exactly that sha256.
    Returns the rows, the series check and the check that each patch's own probe checks passed."""
    signed = sorted((d for d in deps if (d.get("annotations") or {}).get("kind") == "patch"),
                    key=lambda d: (d.get("annotations") or {}).get("position", 0))
    by_id = {str(c.get("id")): c for c in probe_checks}
    by_content = CatalogByContent(catalog, torch)
    names = {str(d.get("name", "")) for d in signed}
    rows = []
    counts = {"signed": 0, "matched": 0, "unknown": 0}
    failed, unproven = [], []
    for d in signed:
        ann = d.get("annotations") or {}
        row: dict[str, Any] = {"id": str(ann.get("patchId", "")), "file": str(d.get("name", "")),
                               "sha256": str((d.get("digest") or {}).get("sha256", "")), "subject": "",
                               "trailers": {}, "source": ""}
        if isinstance(ann.get("patchTrailers"), dict):
            row.update(subject=str(ann.get("patchSubject", "")), trailers=dict(ann["patchTrailers"]),
                       source="signed in the provenance (read from the patch's bytes at certify)")
            counts["signed"] += 1
        else:
            match = by_content.find(row["sha256"], names)
            if match is not None:
                header = evidence.patch_header(match[1])
                row.update(subject=header["subject"], trailers=header["trailers"],
                           source=f"matched by sha256: {match[0]}")
                counts["matched"] += 1
            else:
                row["source"] = ("no catalog given" if catalog is None else
                                 "no catalog file has this sha256") + ": subject and trailers unknown"
                counts["unknown"] += 1
        trailers = row["trailers"]
        row.update(category=trailers.get("Category", ""), upstream_bug=trailers.get("Upstream-Bug", ""),
                   upstream_fix=trailers.get("Upstream-Fix", ""))
        required = [p.strip() for p in trailers.get("Probe", "").split(",") if p.strip()] if trailers else None
        row["probes"] = required or []
        row["results"] = [{"id": c, "status": str((by_id.get(c) or {}).get("status") or "not in the report"),
                           "message": str((by_id.get(c) or {}).get("message") or "")} for c in required or []]
        if required is None:
            row["proof"] = "unknown: its Probe trailer is neither signed nor in a catalog file with its sha256"
            unproven.append(f"{row['id']}: which checks prove it is unknown")
        elif not required:
            row["proof"] = "unknown: its Probe trailer names no check"
            unproven.append(f"{row['id']}: no probe check named")
        else:
            bad = [r for r in row["results"] if r["status"] in ("fail", "error")]
            missing = [r for r in row["results"] if r["status"] != _PASSED and r not in bad]
            if bad:
                row["proof"] = "failed"
                failed.append(f"{row['id']}: " + ", ".join(f"{r['id']} {r['status']}" for r in bad))
            elif missing:
                row["proof"] = "not proven"
                unproven.append(f"{row['id']}: " + ", ".join(
                    f"{r['id']} {r['status']}" + (f" ({r['message']})" if r["message"] else "") for r in missing))
            else:
                row["proof"] = "proven"
        rows.append(row)
    series = Check("patch series", "ok",
                   f"{len(rows)} patches signed by file name and sha256; subject and trailers signed for "
                   f"{counts['signed']}, matched by sha256 in the catalog for {counts['matched']}, unknown for "
                   f"{counts['unknown']}")
    if failed:
        proofs = Check("patch proofs", "failed", "a patch's own probe check failed: " + "; ".join(failed))
    elif unproven:
        proofs = Check("patch proofs", "unproven",
                       f"{len(unproven)} of {len(rows)} patches not proven by a passing probe check: "
                       + "; ".join(unproven))
    else:
        proofs = Check("patch proofs", "ok", f"every one of the {len(rows)} patches' Probe checks ran and passed")
    return rows, series, proofs


CVSS_BLOCKING = 7.0   # an advisory still in triage at this CVSS base score or above keeps the verdict from green


def _score(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _vex_rows(doc: Any) -> list[dict[str, Any]]:
    rows = []
    for v in (doc or {}).get("vulnerabilities") or []:
        if not isinstance(v, dict):
            continue
        analysis = v.get("analysis") or {}
        ratings = [r for r in v.get("ratings") or [] if isinstance(r, dict)]
        scored = [(s, r) for r in ratings if (s := _score(r.get("score"))) is not None]
        score, rating = max(scored, key=lambda sr: sr[0]) if scored else (None, ratings[0] if ratings else {})
        refs = [r.get("id") for r in v.get("references") or [] if isinstance(r, dict) and r.get("id")]
        rows.append({"id": v.get("id", ""), "aliases": refs, "state": analysis.get("state", ""),
                     "justification": analysis.get("justification", ""), "detail": analysis.get("detail", ""),
                     "response": ", ".join(analysis.get("response") or []),
                     "severity": rating.get("severity", ""), "score": score,
                     "method": rating.get("method", ""), "description": (v.get("description") or "")[:300]})
    return rows


def _advisory_check(vex: list[dict[str, Any]] | None, vex_doc: Any) -> Check:
    if vex is None:
        return Check("advisories", "absent", "no VEX is signed with this evidence: no advisory state is stated")
    made = ""
    if isinstance(vex_doc, dict):
        meta = vex_doc.get("metadata") or {}
        sources = [str(p.get("value")) for p in meta.get("properties") or []
                   if isinstance(p, dict) and p.get("name") == "patcher:advisories"]
        made = f" (the signed VEX, made at certify {meta.get('timestamp', '?')} from {'; '.join(sources) or '?'})"
    exploitable = [v["id"] for v in vex if v["state"] == "exploitable"]
    open_high = [f"{v['id']} (CVSS {v['score']:g})" if v["score"] is not None else f"{v['id']} (no CVSS score)"
                 for v in vex if v["state"] == "in_triage" and (v["score"] is None or v["score"] >= CVSS_BLOCKING)]
    if exploitable:
        return Check("advisories", "failed", f"{len(exploitable)} exploitable: {', '.join(exploitable)}{made}")
    if open_high:
        return Check("advisories", "open", f"{len(open_high)} in triage at CVSS >= {CVSS_BLOCKING:g} or unscored: "
                     f"{', '.join(open_high)}{made}")
    triage = sum(1 for v in vex if v["state"] == "in_triage")
    return Check("advisories", "ok", f"{len(vex)} advisories: none exploitable, none in triage at CVSS >= "
                 f"{CVSS_BLOCKING:g}" + (f" ({triage} in triage below it)" if triage else "") + made)


def _where_probed(probe: dict[str, Any]) -> str:
    """Where the probe ran, in the probe report's own words."""
    env = probe.get("environment") or {}
    py = env.get("python") or {}
    plat = env.get("platform") or {}
    facts = [f"Python {py.get('version') or probe.get('python') or '?'}",
             f"torch {(env.get('torch') or {}).get('version') or probe.get('torch') or '?'}"]
    if plat.get("system"):
        facts.append(f"{plat['system']} {plat.get('machine', '')}".strip())
    started = f" {probe['started']}" if probe.get("started") else ""
    where = py.get("executable") or "an interpreter the probe report does not name"
    return f"ran{started} with {where} ({', '.join(facts)})"


def verdict_of(checks: list[Check]) -> str:
    """The worst of the parts: failed (red) when anything failed, incomplete (amber) when anything is
    not proven, verified (green) only when every check is ok."""
    if any(c.status == "failed" for c in checks):
        return "failed"
    return "incomplete" if any(c.status != "ok" for c in checks) else "verified"


VERDICT_RULE = ("The verdict is the worst of its parts: green only when the signature and every signed digest "
                "check out, every patch's own probe checks ran and passed, no advisory is exploitable and none is "
                f"in triage at CVSS {CVSS_BLOCKING:g} or above (or unscored); anything that failed makes it red, "
                "anything not proven or not checked makes it amber.")


def collect(target: Path, public_key: Path | None, catalog: Path | None) -> ReportData:
    """Read and check a wheel's evidence; every check's result is in ``checks`` (nothing raises on a
    failed check: a report of evidence that does not verify is the report an auditor needs most)."""
    located = locate(target)
    wheel = located.wheel
    checks: list[Check] = []
    keyid = ""
    statement: dict[str, Any] | None = None
    if public_key is None:
        checks.append(Check("signature", "failed", "no trusted public key given (--key): the signature is not checked"))
    else:
        from patcher.keys import keyid_of, load_public_key

        try:
            key = load_public_key(public_key)
            keyid = keyid_of(key)
            statement = evidence._load_statement(wheel, key)
            checks.append(Check("signature", "ok", f"DSSE Ed25519 signature by key {keyid[:16]}"))
        except PatcherError as exc:
            checks.append(Check("signature", "failed", str(exc)))
    if statement is None:
        statement = _unverified_statement(wheel)
    predicate = statement.get("predicate") or {}
    bd = predicate.get("buildDefinition") or {}
    subject = next((s for s in statement.get("subject") or [] if isinstance(s, dict)), {})
    wheel_sha = (subject.get("digest") or {}).get("sha256", "")
    if subject.get("name") != wheel.name:
        checks.append(Check("wheel", "failed", f"the statement is about {subject.get('name')}, not {wheel.name}"))
    elif wheel.is_file():
        actual = evidence.sha256_file(wheel)
        checks.append(Check("wheel", "ok" if actual == wheel_sha else "failed",
                            f"sha256 {actual}" + ("" if actual == wheel_sha else f", the statement says {wheel_sha}")))
    else:
        checks.append(Check("wheel", "absent", f"{located.gone}: its own sha256 is not checked (every other check "
                            f"below is made from its signed evidence); the signed sha256 is {wheel_sha}"))

    sbom_path = _checked_file(wheel, _byproduct(predicate, "sbom"), "SBOM", checks)
    probe_path = _checked_file(wheel, _byproduct(predicate, "probe-report"), "probe report", checks)
    vex_item = _byproduct(predicate, "vex")
    vex_path = _checked_file(wheel, vex_item, "VEX", checks, required=False)
    if vex_item is None and wheel.with_name(wheel.name + VEX_SUFFIX).is_file():
        checks.append(Check("VEX", "failed", "a VEX file lies beside the wheel but the statement does not sign it"))

    probe = _read_json(probe_path, "probe report") if probe_path else None
    probe_checks = [c for c in (probe or {}).get("checks") or [] if isinstance(c, dict)]
    if probe is not None:
        where = _where_probed(probe)
        checks.append(Check("probe", "ok" if probe.get("passed") is True else "failed",
                            ("passed: " if probe.get("passed") is True else "the probe report did not pass: ") + where))
    sbom_doc = _read_json(sbom_path, "SBOM") if sbom_path else None
    summary = sbom.summarize(sbom_doc) if sbom_doc else None
    vex_doc = _read_json(vex_path, "VEX") if vex_path else None
    vex = _vex_rows(vex_doc) if vex_path else None

    spec = (bd.get("externalParameters") or {}).get("spec") or {}
    deps = [d for d in bd.get("resolvedDependencies") or [] if isinstance(d, dict)]
    patches, series_check, proofs_check = _patch_rows(deps, catalog, str(spec.get("torch", "")), probe_checks)
    if probe is None:
        proofs_check = Check("patch proofs", "failed", "no signed probe report could be read")
    checks += [series_check, proofs_check, _advisory_check(vex, vex_doc)]
    source = next((d for d in deps if (d.get("annotations") or {}).get("kind") == "source"), {})
    internal = bd.get("internalParameters") or {}
    root_props = {}
    if sbom_doc:
        root_props = {p.get("name"): p.get("value") for p in
                      ((sbom_doc.get("metadata") or {}).get("component") or {}).get("properties") or []}
    repro = {k.split(":", 2)[2]: v for k, v in root_props.items() if str(k).startswith("patcher:reproducibility:")}
    if not repro:
        asked = (internal.get("settings") or {}).get("check_reproducible") == "true"
        repro = {"reproducible": "not recorded" if asked else "not checked",
                 "note": "the build ran without --check-reproducible" if not asked else
                 "the build asked for the check but the signed SBOM holds no result"}
    key_hint = Path(public_key).name if public_key else "PUBLIC-KEY.pem"
    commands = [
        ("the wheel is the signed one", f"sha256sum {wheel.name}    # expect {wheel_sha}"),
        ("signature, digests, patch series, probe", f"patcher verify {wheel.name} --key {key_hint}"),
        ("this page again", f"patcher report {wheel.name} --key {key_hint}"),
    ]
    meta = (predicate.get("runDetails") or {}).get("metadata") or {}
    build = {"id": meta.get("invocationId", ""), "started": meta.get("startedOn", ""),
             "finished": meta.get("finishedOn", ""), "patcher": internal.get("patcherVersion", ""),
             "toolchain": internal.get("toolchain") or {}, "image_id": internal.get("imageId", ""),
             "dockerfile": internal.get("dockerfileSha256", ""), "settings": internal.get("settings") or {},
             "base_image": next((d for d in deps if (d.get("annotations") or {}).get("kind") == "base-image"), {})}
    image_packages = [{"name": str(d.get("name", "")), "source": str((d.get("annotations") or {}).get("source", "")),
                       "purl": str(d.get("uri", ""))}
                      for d in deps if (d.get("annotations") or {}).get("kind") == "image-package"]
    return ReportData(
        wheel=wheel.name, wheel_sha256=wheel_sha, verdict=verdict_of(checks), checks=checks, keyid=keyid,
        statement=statement, spec=spec, source=source,
        submodules=[d for d in deps if (d.get("annotations") or {}).get("kind") == "submodule"],
        overrides=[o for o in internal.get("trustOverrides") or [] if isinstance(o, dict)],
        patches=patches,
        inputs=[d for d in deps if (d.get("annotations") or {}).get("kind") in ("cuda", "cudnn", "input", "pip")],
        image_packages=len(image_packages), image_package_list=image_packages,
        probe=probe, probe_checks=probe_checks, sbom_summary=summary, vex=vex, reproducibility=repro,
        commands=commands, build=build, wheel_gone=located.gone, rule=VERDICT_RULE)


# --------------------------------------------------------------------------------------------
# the chart and the page
_STATUS_COLOUR = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#cf222e", "skip": "#8c959f"}


def probe_chart(checks: list[dict[str, Any]], width: int = 720) -> str:
    """Each check's duration as a horizontal bar (inline SVG; text is real text, selectable)."""
    if not checks:
        return ""
    row, label_w, pad = 18, 250, 60
    longest = max(float(c.get("duration_s") or 0.0) for c in checks) or 1.0
    scale = (width - label_w - pad) / longest
    height = row * len(checks) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="chart" aria-label="probe check durations">']
    for i, c in enumerate(checks):
        y = i * row + 4
        dur = float(c.get("duration_s") or 0.0)
        status = str(c.get("status", ""))
        colour = _STATUS_COLOUR.get(status, "#57606a")
        w = max(dur * scale, 1.5)
        name = html.escape(str(c.get("id", "")))
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end" font-size="11">{name}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 6}" fill="{colour}">'
                     f'<title>{name}: {status}, {dur:.3f} s</title></rect>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" font-size="10" fill="#57606a">'
                     f'{html.escape(status)} {dur:.2f} s</text>')
    axis_y = row * len(checks) + 16
    parts.append(f'<text x="{label_w}" y="{axis_y}" font-size="10" fill="#57606a">0 s</text>')
    parts.append(f'<text x="{width - pad}" y="{axis_y}" font-size="10" fill="#57606a" text-anchor="end">'
                 f'{longest:.2f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(data: ReportData) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("patcher", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    summary = data.probe.get("summary") if data.probe else {}
    return env.get_template(TEMPLATE).render(
        d=data, chart=probe_chart(data.probe_checks), probe_summary=summary or {},
        safe_url=_safe_url)


def _safe_url(value: str) -> str:
    """An upstream reference as a link target only when it is an http(s) URL (never javascript: etc.)."""
    return value if isinstance(value, str) and value.startswith(("https://", "http://")) else ""


# --------------------------------------------------------------------------------------------
# writing it
@dataclass(frozen=True)
class ReportResult:
    html: Path
    pdf: Path | None
    verdict: str
    checks: list[Check]
    wheel_gone: str = ""


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def print_pdf(html_path: Path, pdf_path: Path, timeout: float = 120.0) -> None:
    """Print the page with headless Chromium (no network: the page needs none)."""
    exe = chromium_binary()
    if exe is None:
        raise ReportRenderError("--pdf needs Chromium, which is not installed",
                                hint="install Debian's `chromium` package, or leave out --pdf")
    with tempfile.TemporaryDirectory(prefix="patcher-report-chromium-") as profile:
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # nothing can leave
                f"--user-data-dir={profile}", "--no-pdf-header-footer", f"--print-to-pdf={pdf_path}",
                Path(html_path).resolve().as_uri()]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=dict(os.environ, HOME=profile))
        except subprocess.TimeoutExpired:
            raise ReportRenderError(f"Chromium did not print {html_path.name} within {timeout:.0f} s") from None
    if proc.returncode != 0 or not pdf_path.is_file() or pdf_path.stat().st_size == 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise ReportRenderError(f"Chromium could not print {html_path.name} (exit {proc.returncode}): {last[:300]}")


def write_report(target: Path, out: Path | None = None, pdf: bool = False, public_key: Path | None = None,
                 catalog: Path | None = None) -> ReportResult:
    data = collect(Path(target), public_key, catalog)
    wheel = find_wheel(Path(target))
    html_path = Path(out) if out is not None else wheel.with_name(wheel.name + REPORT_SUFFIX)
    page = render_html(data)
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        from patcher.record import write_atomic

        write_atomic(html_path, page)
    except OSError as exc:
        raise ReportRenderError(f"cannot write the report {html_path}: {exc.strerror or exc}") from None
    pdf_path = None
    if pdf:
        pdf_path = html_path.with_suffix(".pdf")
        partial = pdf_path.with_name(f".{pdf_path.name}.tmp")
        try:
            print_pdf(html_path, partial)
            os.replace(partial, pdf_path)
        finally:
            partial.unlink(missing_ok=True)   # Chromium may leave a half-printed file behind
    return ReportResult(html=html_path, pdf=pdf_path, verdict=data.verdict, checks=data.checks,
                        wheel_gone=data.wheel_gone)
