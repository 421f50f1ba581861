"""Report stage: a wheel's signed evidence -> one self-contained HTML page (and a PDF) for an auditor.

``patcher report WHEEL|BUILD_DIR|EVIDENCE_DIR`` reads only what certify signed: the DSSE-signed
statement (``W.intoto.jsonl``), and the files it binds by digest (the SBOM, the probe report, a
VEX when one is there).  The catalog's patch files are read for their subject and trailers only
when their sha256 is the one the statement signed.  Every check is made again here and its
result printed on top: a page whose evidence does not verify says so in red before anything else.

The page carries its style and its chart inline: no script, no font, no image, no request leaves
it.  The PDF is the same page printed by headless Chromium.
"""

from __future__ import annotations

import base64
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
from patcher.errors import EvidenceFormatError, PatcherError, ReportRenderError

REPORT_SUFFIX = ".report.html"
VEX_SUFFIX = ".vex.json"
TEMPLATE = "report.html.j2"


# --------------------------------------------------------------------------------------------
# what the page says
@dataclass
class Check:
    name: str
    status: str            # ok | failed | absent | skipped
    detail: str = ""


@dataclass
class ReportData:
    wheel: str
    wheel_sha256: str
    verdict: str           # verified | incomplete (nothing failed, something not checkable) | failed
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


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvidenceFormatError(f"{what} {path.name} cannot be read as JSON: {exc}") from None


def find_wheel(target: Path) -> Path:
    """The wheel path a target names: a wheel, a build directory (record.json), an evidence folder."""
    target = Path(target)
    if target.suffix == ".whl":
        if not target.with_name(target.name + evidence.PROVENANCE_SUFFIX).is_file():
            raise EvidenceFormatError(f"no provenance {target.name}{evidence.PROVENANCE_SUFFIX} beside {target}",
                                      hint="run `patcher certify` for this build first")
        return target
    if not target.is_dir():
        raise EvidenceFormatError(f"{target} is neither a wheel nor a directory")
    record = target / "record.json"
    if record.is_file():
        data = _read_json(record, "build record")
        path = (data.get("wheel") or {}).get("path") if isinstance(data, dict) else None
        if not path:
            raise EvidenceFormatError(f"build record {record} names no wheel: the build has not finished")
        wheel = Path(path) if Path(path).is_absolute() else target / path
        return find_wheel(wheel)
    found = sorted(target.glob("*.whl" + evidence.PROVENANCE_SUFFIX))
    if len(found) != 1:
        raise EvidenceFormatError(f"{target} holds {len(found)} provenance files, not one",
                                  hint="give the wheel itself")
    return found[0].with_name(found[0].name[: -len(evidence.PROVENANCE_SUFFIX)])


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


def _patch_rows(deps: list[dict[str, Any]], catalog: Path | None, torch: str,
                probe_checks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Check]:
    from patcher.patches import parse_patch_file

    signed = sorted((d for d in deps if (d.get("annotations") or {}).get("kind") == "patch"),
                    key=lambda d: d["annotations"].get("position", 0))
    rows = []
    mismatched = []
    for d in signed:
        ann = d.get("annotations") or {}
        row = {"id": ann.get("patchId", ""), "file": d.get("name", ""), "sha256": (d.get("digest") or {}).get("sha256", ""),
               "subject": "", "category": "", "upstream_bug": "", "upstream_fix": "", "probes": [],
               "catalog": "not read"}
        path = Path(catalog) / "patches" / torch / row["file"] if catalog else None
        if path is not None and path.is_file():
            try:
                patch = parse_patch_file(path, torch)
            except PatcherError as exc:
                row["catalog"] = f"unreadable: {exc}"
            else:
                if patch.sha256 == row["sha256"]:
                    row.update(subject=patch.subject, category=patch.category, catalog="matches the signed sha256",
                               upstream_bug=patch.trailers.get("Upstream-Bug", ""),
                               upstream_fix=patch.trailers.get("Upstream-Fix", ""), probes=list(patch.probes))
                else:
                    row["catalog"] = f"differs: the catalog's file has sha256 {patch.sha256[:16]}…"
                    mismatched.append(row["file"])
        elif path is not None:
            row["catalog"] = "not in the catalog"
            mismatched.append(row["file"])
        by_patch = [c for c in probe_checks
                    if row["id"] in (c.get("patches") or []) or c.get("id") in row["probes"]]
        row["results"] = [{"id": c.get("id"), "status": c.get("status")} for c in by_patch]
        rows.append(row)
    if catalog is None:
        check = Check("patch series", "skipped", "no catalog given: patch subjects and trailers not shown")
    elif mismatched:
        check = Check("patch series", "failed", "differs from the catalog: " + ", ".join(mismatched))
    else:
        check = Check("patch series", "ok", f"{len(rows)} patches, each the catalog's file by sha256")
    return rows, check


def _vex_rows(doc: Any) -> list[dict[str, Any]]:
    rows = []
    for v in (doc or {}).get("vulnerabilities") or []:
        if not isinstance(v, dict):
            continue
        analysis = v.get("analysis") or {}
        ratings = v.get("ratings") or [{}]
        rating = ratings[0] if isinstance(ratings[0], dict) else {}
        refs = [r.get("id") for r in v.get("references") or [] if isinstance(r, dict) and r.get("id")]
        rows.append({"id": v.get("id", ""), "aliases": refs, "state": analysis.get("state", ""),
                     "justification": analysis.get("justification", ""), "detail": analysis.get("detail", ""),
                     "response": ", ".join(analysis.get("response") or []),
                     "severity": rating.get("severity", ""), "score": rating.get("score", ""),
                     "description": (v.get("description") or "")[:300]})
    return rows


def collect(target: Path, public_key: Path | None, catalog: Path | None) -> ReportData:
    """Read and check a wheel's evidence; every check's result is in ``checks`` (nothing raises on a
    failed check: a report of evidence that does not verify is the report an auditor needs most)."""
    wheel = find_wheel(target)
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
        checks.append(Check("wheel", "absent", f"not beside the evidence; the signed sha256 is {wheel_sha}"))

    sbom_path = _checked_file(wheel, _byproduct(predicate, "sbom"), "SBOM", checks)
    probe_path = _checked_file(wheel, _byproduct(predicate, "probe-report"), "probe report", checks)
    vex_item = _byproduct(predicate, "vex")
    vex_path = _checked_file(wheel, vex_item, "VEX", checks, required=False)
    if vex_item is None and wheel.with_name(wheel.name + VEX_SUFFIX).is_file():
        checks.append(Check("VEX", "failed", "a VEX file lies beside the wheel but the statement does not sign it"))

    probe = _read_json(probe_path, "probe report") if probe_path else None
    probe_checks = [c for c in (probe or {}).get("checks") or [] if isinstance(c, dict)]
    if probe is not None:
        checks.append(Check("probe", "ok" if probe.get("passed") else "failed",
                            "passed" if probe.get("passed") else "the probe report did not pass"))
    sbom_doc = _read_json(sbom_path, "SBOM") if sbom_path else None
    summary = sbom.summarize(sbom_doc) if sbom_doc else None
    vex = _vex_rows(_read_json(vex_path, "VEX")) if vex_path else None

    spec = (bd.get("externalParameters") or {}).get("spec") or {}
    deps = [d for d in bd.get("resolvedDependencies") or [] if isinstance(d, dict)]
    patches, series_check = _patch_rows(deps, catalog, str(spec.get("torch", "")), probe_checks)
    checks.append(series_check)
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
    failed = [c for c in checks if c.status == "failed"]
    verdict = "failed" if failed else ("incomplete" if any(c.status != "ok" for c in checks) else "verified")
    meta = (predicate.get("runDetails") or {}).get("metadata") or {}
    build = {"id": meta.get("invocationId", ""), "started": meta.get("startedOn", ""),
             "finished": meta.get("finishedOn", ""), "patcher": internal.get("patcherVersion", ""),
             "toolchain": internal.get("toolchain") or {}, "image_id": internal.get("imageId", ""),
             "dockerfile": internal.get("dockerfileSha256", ""), "settings": internal.get("settings") or {},
             "base_image": next((d for d in deps if (d.get("annotations") or {}).get("kind") == "base-image"), {})}
    return ReportData(
        wheel=wheel.name, wheel_sha256=wheel_sha, verdict=verdict, checks=checks, keyid=keyid,
        statement=statement, spec=spec, source=source,
        submodules=[d for d in deps if (d.get("annotations") or {}).get("kind") == "submodule"],
        overrides=[o for o in internal.get("trustOverrides") or [] if isinstance(o, dict)],
        patches=patches,
        inputs=[d for d in deps if (d.get("annotations") or {}).get("kind") in ("cuda", "cudnn", "input", "pip")],
        image_packages=sum(1 for d in deps if (d.get("annotations") or {}).get("kind") == "image-package"),
        probe=probe, probe_checks=probe_checks, sbom_summary=summary, vex=vex, reproducibility=repro,
        commands=commands, build=build)


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
        print_pdf(html_path, pdf_path)
    return ReportResult(html=html_path, pdf=pdf_path, verdict=data.verdict, checks=data.checks)
