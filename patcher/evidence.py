"""Certify stage: BuildRecord + ProbeReport -> signed SLSA provenance, CycloneDX SBOM; and verify.

Beside a certified wheel ``W`` lie (names fixed, the index publishes them the same way):

    W.intoto.jsonl   DSSE envelopes, one a line; each signs an in-toto Statement v1 whose
                     subject is W (name + sha256) and whose predicate is SLSA provenance v1
    W.cdx.json       CycloneDX SBOM of what went into W (byte-stable for one build)
    W.probe.json     the probe report, as the probe wrote it
    W.vex.json       CycloneDX VEX: every published torch advisory and its state for W (vex.py)

The statement binds the other two by digest (runDetails.byproducts), so verifying the one
signature covers the wheel, the SBOM, the probe report and the patch series.  Everything
is serialised deterministically (sorted keys, fixed separators, serial number and timestamp
derived from the build, Ed25519's deterministic signatures): certifying one build twice
gives identical bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from patcher import __version__
from patcher.errors import (
    EvidenceFormatError,
    KeyMismatchError,
    PatchSeriesMismatchError,
    ProbeReportNotPassedError,
    SignatureError,
    WheelDigestMismatchError,
)
from patcher.keys import keyid_of, load_private_key, load_public_key
from patcher.record import BuildRecord, load_record
from patcher.spec import BuildSpec
from patcher.util import sha256_file
from patcher.vex import VEX_SUFFIX

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
# What the provenance's parameters mean: a patcher container build of a torch wheel.
BUILD_TYPE = "urn:patcher:buildtype:torch-wheel:v1"
BUILDER_ID = "urn:patcher:builder:docker"

PROVENANCE_SUFFIX = ".intoto.jsonl"
SBOM_SUFFIX = ".cdx.json"
PROBE_SUFFIX = ".probe.json"
EVIDENCE_SUFFIXES = (PROVENANCE_SUFFIX, SBOM_SUFFIX, PROBE_SUFFIX, VEX_SUFFIX)

# uuid5 namespace for SBOM serial numbers: the serial is uuid5(namespace, wheel sha256).
SBOM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:patcher:sbom")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------------------------
# small helpers
def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _parse_time(value: str, what: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise EvidenceFormatError(f"build record {what} {value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------
# DSSE
def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(payload), payload)


def sign_envelope(payload: bytes, key: Ed25519PrivateKey, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    signature = key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [{"keyid": keyid_of(key.public_key()),
                        "sig": base64.b64encode(signature).decode("ascii")}],
    }


def _b64decode(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise EvidenceFormatError(f"DSSE envelope {what} is not a base64 string")
    # DSSE accepts standard and URL-safe base64; both strictly (no silently skipped characters).
    try:
        return base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise EvidenceFormatError(f"DSSE envelope {what} is not valid base64") from None


def open_envelope(envelope: dict[str, Any], public_key: Ed25519PublicKey) -> bytes:
    """The payload, once a signature by ``public_key`` verifies over its PAE; raises otherwise."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("signatures"), list):
        raise EvidenceFormatError("DSSE envelope has no signatures list")
    payload_type = envelope.get("payloadType")
    if payload_type != PAYLOAD_TYPE:
        raise EvidenceFormatError(f"DSSE payloadType is {payload_type!r}, expected {PAYLOAD_TYPE}")
    payload = _b64decode(envelope.get("payload"), "payload")
    message = pae(payload_type, payload)
    ours = keyid_of(public_key)
    keyids = []
    for entry in envelope["signatures"]:
        if not isinstance(entry, dict):
            raise EvidenceFormatError("DSSE signature entry is not an object")
        keyids.append(str(entry.get("keyid") or "?"))
        try:
            public_key.verify(_b64decode(entry.get("sig"), "signature"), message)
            return payload
        except InvalidSignature:
            continue
    if ours in keyids:
        raise SignatureError(f"the signature by key {ours[:16]} does not match the statement: "
                             "the statement or its signature was altered after signing")
    raise KeyMismatchError(f"the evidence is signed by key {', '.join(k[:16] for k in keyids)}, "
                           f"not by the trusted key {ours[:16]}",
                           hint="verify with the public key of the site that certified the wheel (--key)")


# --------------------------------------------------------------------------------------------
# probe report
@dataclass(frozen=True)
class ProbeReportFile:
    name: str
    data: bytes
    sha256: str
    passed: bool


def read_probe_report(path: Path, name: str | None = None) -> ProbeReportFile:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise EvidenceFormatError(f"probe report {path} does not exist",
                                  hint="run `patcher probe` and give its JSON report") from None
    except OSError as exc:
        raise EvidenceFormatError(f"probe report {path} cannot be read: {exc.strerror}") from None
    try:
        report = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EvidenceFormatError(f"probe report {path} is not valid JSON") from None
    if not isinstance(report, dict) or report.get("schema") != 1:
        raise EvidenceFormatError(f"probe report {path} is not a schema 1 probe report")
    if not isinstance(report.get("passed"), bool) or not isinstance(report.get("checks"), list):
        raise EvidenceFormatError(f"probe report {path} lacks a boolean 'passed' or a 'checks' list")
    return ProbeReportFile(name=name or Path(path).name, data=data,
                           sha256=hashlib.sha256(data).hexdigest(), passed=report["passed"])


# --------------------------------------------------------------------------------------------
# provenance
def _spec_of(record: BuildRecord) -> BuildSpec:
    try:
        return BuildSpec.from_json(record.spec)
    except (TypeError, KeyError, ValueError) as exc:
        raise EvidenceFormatError(f"build record spec is malformed: {exc}") from None


def trust_overrides(spec: BuildSpec, record: BuildRecord) -> list[dict[str, str]]:
    """Every explicit trust decision that shaped the build, as the spec and the record state them."""
    used: list[dict[str, str]] = []
    if spec.commit_overridden:
        used.append({"kind": "tag_commit", "name": spec.torch, "value": spec.commit})
    if spec.image.overridden:
        used.append({"kind": "image", "name": spec.image.name, "value": spec.image.pinned})
    for art in (spec.cuda_runfile, spec.cudnn_archive, *spec.inputs):
        if art is not None and art.overridden:
            used.append({"kind": "artifact", "name": art.name, "value": art.sha256})
    used.extend(dict(o) for o in record.trust_overrides)
    return used


def _digest_of(value: str) -> dict[str, str]:
    algo, _, hexdigest = value.partition(":")
    return {algo: hexdigest} if hexdigest else {"sha256": value}


# --------------------------------------------------------------------------------------------
# what a patch says about itself
_TRAILER_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*):[ \t]*(.*)$")


def patch_header(data: bytes) -> dict[str, Any]:
    """The subject and trailers of one format-patch message, as its bytes state them.

    Read without the catalog's rules on purpose: a patch of an older catalog may lack a trailer
    that today's catalog requires, and what it says is still what was signed."""
    text = data.decode("utf-8", "replace")
    head, _, body = text.partition("\n\n")
    found = re.search(r"^Subject:[ \t]*(.*(?:\n[ \t].*)*)", head, re.M)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(found.group(1).split())) if found else ""
    diff = re.search(r"^diff --git ", body, re.M)
    message = body[:diff.start()] if diff else body
    separator = re.search(r"^---$", message, re.M)
    if separator:
        message = message[:separator.start()]
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip("\n")) if p.strip()]
    trailers: dict[str, str] = {}
    key = None
    for line in paragraphs[-1].splitlines() if len(paragraphs) > 1 else []:
        match = _TRAILER_LINE.match(line)
        if match:
            key = match.group(1)
            trailers[key] = match.group(2).strip()
        elif line[:1] in (" ", "\t") and key:
            trailers[key] += " " + line.strip()   # a folded trailer
        else:
            trailers = {}                         # not a trailer block after all
            break
    return {"subject": subject, "trailers": trailers}


def catalog_patch_headers(catalog: Path | None, torch: str, record: BuildRecord) -> dict[str, dict[str, Any]]:
    """For each patch of the record whose catalog file still has the recorded sha256: its subject and
    trailers, so that the signed statement carries them (a later catalog may change or drop the file)."""
    if catalog is None:
        return {}
    out = {}
    for patch in record.patches:
        path = Path(catalog) / "patches" / torch / patch.file
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == patch.sha256:
            out[patch.file] = patch_header(data)
    return out


def resolved_dependencies(spec: BuildSpec, record: BuildRecord, inventory: Any = None,
                          patch_headers: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    src = record.source
    deps: list[dict[str, Any]] = [{
        "name": "source", "uri": f"git+{src.repo}@refs/tags/{src.tag}",
        "digest": {"gitCommit": src.commit},
        "annotations": {"kind": "source", "tag": src.tag, **({"treeHash": src.tree_hash} if src.tree_hash else {})},
    }]
    for sub in src.submodules:
        deps.append({"name": f"submodule:{sub.path}", "uri": f"git+{sub.url}",
                     "digest": {"gitCommit": sub.commit}, "annotations": {"kind": "submodule", "path": sub.path}})
    for position, patch in enumerate(record.patches, start=1):
        annotations = {"kind": "patch", "patchId": patch.id, "commit": patch.commit, "position": position}
        header = (patch_headers or {}).get(patch.file)
        if header is not None:
            annotations.update(patchSubject=header["subject"], patchTrailers=header["trailers"])
        deps.append({"name": patch.file, "uri": f"patcher:patches/{spec.torch}/{patch.file}",
                     "digest": {"sha256": patch.sha256}, "annotations": annotations})
    deps.append({"name": "base-image", "uri": f"docker://{spec.image.ref}",
                 "digest": _digest_of(record.base_image_digest),
                 "annotations": {"kind": "base-image", "image": spec.image.name}})
    for kind, art in (("cuda", spec.cuda_runfile), ("cudnn", spec.cudnn_archive),
                      *(("input", a) for a in spec.inputs)):
        if art is not None:
            deps.append({"name": art.name, "uri": art.url, "digest": {"sha256": art.sha256},
                         "annotations": {"kind": kind}})
    for req in record.build_requirements:
        entry: dict[str, Any] = {"name": f"{req.name}=={req.version}", "uri": f"pkg:pypi/{req.name}@{req.version}",
                                 "annotations": {"kind": "pip"}}
        if req.sha256:
            entry["digest"] = {"sha256": req.sha256}
        deps.append(entry)
    from patcher.sbom import image_package_dependencies  # the builder image's packages, .buildinfo style

    deps.extend(image_package_dependencies(inventory))
    return deps


def build_statement(record: BuildRecord, spec: BuildSpec, byproducts: list[dict[str, Any]],
                    inventory: Any = None, patch_headers: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": record.wheel.name, "digest": {"sha256": record.wheel.sha256}}],
        "predicateType": PROVENANCE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"spec": record.spec},
                "internalParameters": {
                    "patcherVersion": __version__,
                    "trustOverrides": trust_overrides(spec, record),
                    "settings": dict(record.settings),
                    "dockerfileSha256": record.dockerfile_sha256,
                    "imageId": record.image_id,
                    "toolchain": dict(record.toolchain),
                    # patches whose probe checks could not run on this build, and why
                    "unprovenPatches": [{"id": u.id, "checks": list(u.checks), "reason": u.reason}
                                        for u in record.unproven_patches],
                },
                "resolvedDependencies": resolved_dependencies(spec, record, inventory, patch_headers),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"patcher": __version__}},
                "metadata": {
                    "invocationId": record.build_id,
                    "startedOn": _rfc3339(_parse_time(record.started, "start time")),
                    "finishedOn": _rfc3339(_parse_time(record.finished, "finish time")),
                },
                "byproducts": byproducts,
            },
        },
    }


# --------------------------------------------------------------------------------------------
# SBOM
def sbom_timestamp(record: BuildRecord) -> datetime:
    """SOURCE_DATE_EPOCH when set (reproducible-builds convention), else the build's finish time."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            return datetime.fromtimestamp(int(epoch), tz=timezone.utc)
        except (ValueError, OverflowError):
            raise EvidenceFormatError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds") from None
    return _parse_time(record.finished, "finish time").replace(microsecond=0)


def build_sbom(record: BuildRecord, spec: BuildSpec, wheel_path: Path | None = None,
               inventory: Any = None, reproducibility: dict[str, Any] | None = None,
               supplier: str | None = None) -> bytes:
    """The CycloneDX SBOM (patcher/sbom.py): the record, the wheel's ELF files, the image inventory."""
    from patcher import sbom

    return sbom.build_sbom(record, spec, wheel_path=wheel_path, inventory=inventory,
                           timestamp=sbom_timestamp(record), reproducibility=reproducibility, supplier=supplier)


# --------------------------------------------------------------------------------------------
# certify
@dataclass(frozen=True)
class CertifyResult:
    wheel: Path
    provenance: Path
    sbom: Path
    probe_report: Path
    keyid: str
    probe_passed: bool
    vex: Path | None = None


def _stage_and_replace(files: dict[Path, bytes | Path]) -> None:
    """Write every file to a temp name first, then rename them all: no half-written evidence."""
    staged: list[tuple[str, Path]] = []
    try:
        for target, content in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            staged.append((tmp, target))
            with os.fdopen(fd, "wb") as fh:
                if isinstance(content, Path):
                    with open(content, "rb") as src:
                        shutil.copyfileobj(src, fh, _CHUNK)
                else:
                    fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
        for tmp, target in staged:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def certify(record_path: Path, probe_report_path: Path, key_path: Path, out_dir: Path | None = None,
            allow_failed_probe: bool = False, advisories_file: Path | None = None,
            catalog: Path | None = None) -> CertifyResult:
    """Sign the evidence of one build.  ``catalog``: the catalog root; each patch file there that still
    has the recorded sha256 gives its subject and trailers to the statement (the report reads them)."""
    record_path = Path(record_path)
    record = load_record(record_path)
    spec = _spec_of(record)
    record_dir = record_path.resolve().parent
    wheel_path = record.resolve(record_dir, record.wheel.path)
    if wheel_path.name != record.wheel.name:
        raise EvidenceFormatError(f"build record names wheel {record.wheel.name} but its path is {wheel_path}")
    if not wheel_path.is_file():
        raise EvidenceFormatError(f"the wheel {wheel_path} named in the build record does not exist")
    actual = sha256_file(wheel_path)
    if actual != record.wheel.sha256:
        raise WheelDigestMismatchError(
            f"wheel {wheel_path.name} has sha256 {actual}, the build record says {record.wheel.sha256}",
            hint="the wheel changed after the build; rebuild it")
    report = read_probe_report(probe_report_path, name=record.wheel.name + PROBE_SUFFIX)
    if not report.passed and not allow_failed_probe:
        raise ProbeReportNotPassedError(f"probe report {probe_report_path} did not pass; refusing to certify",
                                        hint="fix the build, or pass --allow-failed-probe to sign a record of the failure")
    key = load_private_key(key_path)

    log_path = record.resolve(record_dir, record.log_path)
    if log_path.is_file():
        log_sha256 = sha256_file(log_path)
        if record.log_sha256 and record.log_sha256 != log_sha256:
            raise EvidenceFormatError(f"build log {log_path} has sha256 {log_sha256}, the record says {record.log_sha256}")
    elif record.log_sha256:
        log_sha256 = record.log_sha256
    else:
        raise EvidenceFormatError(f"build log {log_path} does not exist and the record has no log_sha256")

    from patcher import sbom as sbom_mod

    inventory = sbom_mod.load_inventory(record_dir)
    if inventory is not None and inventory.wheel_sha256 != record.wheel.sha256:
        raise EvidenceFormatError(f"the image inventory beside {record_path.name} is of another wheel "
                                  f"(sha256 {inventory.wheel_sha256[:16]}), not {record.wheel.name}",
                                  hint="scan the builder image again for this wheel, or remove the stale inventory")
    sbom = build_sbom(record, spec, wheel_path=wheel_path, inventory=inventory,
                      reproducibility=sbom_mod.read_reproducibility(record_path),
                      supplier=f"patcher rebuild, signing key {keyid_of(key.public_key())[:16]}")
    sbom_name = record.wheel.name + SBOM_SUFFIX
    vex_doc = _build_vex(record, spec, report, advisories_file)
    vex_name = record.wheel.name + VEX_SUFFIX
    byproducts = [
        {"name": report.name, "digest": {"sha256": report.sha256}, "mediaType": "application/json",
         "annotations": {"kind": "probe-report", "passed": report.passed}},
        {"name": sbom_name, "digest": {"sha256": hashlib.sha256(sbom).hexdigest()},
         "mediaType": "application/vnd.cyclonedx+json", "annotations": {"kind": "sbom"}},
        {"name": vex_name, "digest": {"sha256": hashlib.sha256(vex_doc).hexdigest()},
         "mediaType": "application/vnd.cyclonedx+json", "annotations": {"kind": "vex"}},
        {"name": Path(record.log_path).name, "digest": {"sha256": log_sha256}, "mediaType": "text/plain",
         "annotations": {"kind": "build-log"}},
    ]
    statement = build_statement(record, spec, byproducts, inventory,
                                catalog_patch_headers(catalog, spec.torch, record))
    envelope = sign_envelope(canonical_json(statement), key)
    # Everything is computed: only now touch the file system.
    out = Path(out_dir) if out_dir is not None else wheel_path.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvidenceFormatError(f"cannot create output directory {out}: {exc.strerror}") from None
    targets = {
        out / report.name: report.data,
        out / sbom_name: sbom,
        out / vex_name: vex_doc,
        out / (record.wheel.name + PROVENANCE_SUFFIX): canonical_json(envelope) + b"\n",
    }
    out_wheel = out / record.wheel.name
    if out_wheel.resolve() != wheel_path.resolve():
        targets = {out_wheel: wheel_path, **targets}
    try:
        _stage_and_replace(targets)
    except OSError as exc:
        raise EvidenceFormatError(f"cannot write evidence into {out}: {exc.strerror}") from None
    return CertifyResult(wheel=out_wheel, provenance=out / (record.wheel.name + PROVENANCE_SUFFIX),
                         sbom=out / sbom_name, probe_report=out / report.name,
                         keyid=keyid_of(key.public_key()), probe_passed=report.passed, vex=out / vex_name)


def _build_vex(record: BuildRecord, spec: BuildSpec, report: ProbeReportFile, advisories_file: Path | None) -> bytes:
    from patcher import vex

    findings, data = vex.findings_for_build(record, spec, report.data, advisories_file)
    return vex.build_vex(wheel_name=record.wheel.name, wheel_sha256=record.wheel.sha256,
                         torch_version=f"{spec.torch}+{spec.local_label}", findings=findings, sources=data.sources,
                         sbom_serial=str(uuid.uuid5(SBOM_NAMESPACE, record.wheel.sha256)),
                         timestamp=_rfc3339(sbom_timestamp(record)))


# --------------------------------------------------------------------------------------------
# verify
@dataclass(frozen=True)
class VerifyResult:
    wheel: str
    sha256: str
    keyid: str
    build_id: str
    torch: str
    patches: list[str] = field(default_factory=list)
    probe_report: str = ""
    sbom: str = ""
    trust_overrides: list[dict[str, str]] = field(default_factory=list)
    vex: str = ""
    vex_states: dict[str, int] = field(default_factory=dict)


def read_series(catalog: Path, torch: str) -> list[tuple[str, str]]:
    """(file, sha256) for each patch of ``patches/<torch>/series``, in order."""
    series_dir = Path(catalog) / "patches" / torch
    series = series_dir / "series"
    if not series.is_file():
        return []
    out = []
    for line in series.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        path = series_dir / name
        if not path.is_file():
            raise PatchSeriesMismatchError(f"catalog series {series} lists {name}, which does not exist")
        out.append((name, sha256_file(path)))
    return out


def _load_statement(wheel: Path, public_key: Ed25519PublicKey) -> dict[str, Any]:
    provenance = wheel.with_name(wheel.name + PROVENANCE_SUFFIX)
    try:
        lines = [ln for ln in provenance.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except FileNotFoundError:
        raise EvidenceFormatError(f"no provenance {provenance.name} beside the wheel",
                                  hint="run `patcher certify` for this build") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceFormatError(f"provenance {provenance} cannot be read: {exc}") from None
    if not lines:
        raise EvidenceFormatError(f"provenance {provenance.name} is empty")
    last_error: Exception | None = None
    for line in lines:
        try:
            envelope = json.loads(line)
        except json.JSONDecodeError:
            raise EvidenceFormatError(f"provenance {provenance.name} holds a line that is not JSON") from None
        try:
            payload = open_envelope(envelope, public_key)
        except (SignatureError, KeyMismatchError) as exc:
            last_error = exc
            continue
        try:
            statement = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EvidenceFormatError("the signed payload is not JSON") from None
        if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
            raise EvidenceFormatError(f"the signed payload is not an in-toto {STATEMENT_TYPE} statement")
        if statement.get("predicateType") == PROVENANCE_TYPE:
            return statement
    if last_error is not None:
        raise last_error
    raise EvidenceFormatError(f"provenance {provenance.name} holds no SLSA provenance statement")


def _byproduct(predicate: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in predicate.get("runDetails", {}).get("byproducts", []):
        if isinstance(item, dict) and item.get("annotations", {}).get("kind") == kind:
            return item
    raise EvidenceFormatError(f"the statement records no {kind} byproduct")


def _check_beside(wheel: Path, item: dict[str, Any], what: str) -> Path:
    name = str(item.get("name", ""))
    if not name or "/" in name or name.startswith("."):
        raise EvidenceFormatError(f"the statement's {what} name {name!r} is not a plain file name")
    path = wheel.with_name(name)
    try:
        actual = sha256_file(path)
    except FileNotFoundError:
        raise EvidenceFormatError(f"no {what} {name} beside the wheel") from None
    expected = item.get("digest", {}).get("sha256")
    if actual != expected:
        raise EvidenceFormatError(f"{what} {name} has sha256 {actual}, the signed statement says {expected}",
                                  hint=f"the {what} was altered or replaced after certification")
    return path


def verify(wheel: Path, public_key_path: Path, catalog: Path) -> VerifyResult:
    wheel = Path(wheel)
    if not wheel.is_file():
        raise EvidenceFormatError(f"no wheel at {wheel}")
    public_key = load_public_key(public_key_path)
    statement = _load_statement(wheel, public_key)
    try:
        predicate = statement["predicate"]
        spec = predicate["buildDefinition"]["externalParameters"]["spec"]
        torch = spec["torch"]
        deps = predicate["buildDefinition"]["resolvedDependencies"]
        build_id = predicate["runDetails"]["metadata"]["invocationId"]
        overrides = predicate["buildDefinition"]["internalParameters"].get("trustOverrides", [])
    except (KeyError, TypeError):
        raise EvidenceFormatError("the statement lacks the SLSA provenance fields patcher writes") from None

    # 1. the wheel is the subject
    actual = sha256_file(wheel)
    subjects = {s.get("name"): s.get("digest", {}).get("sha256") for s in statement.get("subject", [])
                if isinstance(s, dict)}
    if wheel.name not in subjects:
        raise WheelDigestMismatchError(f"the statement is about {', '.join(map(str, subjects))}, not {wheel.name}")
    if subjects[wheel.name] != actual:
        raise WheelDigestMismatchError(f"wheel {wheel.name} has sha256 {actual}, the signed statement says "
                                       f"{subjects[wheel.name]}", hint="the wheel was altered after certification")

    # 2. the patch series is the catalog's
    signed = sorted((d for d in deps if isinstance(d, dict) and d.get("annotations", {}).get("kind") == "patch"),
                    key=lambda d: d["annotations"].get("position", 0))
    signed_series = [(d.get("name"), d.get("digest", {}).get("sha256")) for d in signed]
    catalog_series = read_series(catalog, torch)
    if [n for n, _ in signed_series] != [n for n, _ in catalog_series]:
        raise PatchSeriesMismatchError(
            f"the wheel was built with patches [{', '.join(str(n) for n, _ in signed_series)}], the catalog's "
            f"series for torch {torch} is [{', '.join(n for n, _ in catalog_series)}]",
            hint=f"verify against the catalog the build used (--catalog), at {Path(catalog) / 'patches' / torch}")
    for (name, signed_sha), (_, catalog_sha) in zip(signed_series, catalog_series):
        if signed_sha != catalog_sha:
            raise PatchSeriesMismatchError(
                f"patch {name} has sha256 {catalog_sha} in the catalog, the wheel was built with {signed_sha}",
                hint="the catalog's patch differs from the one the wheel was built with")

    # 3. the SBOM and the probe report beside the wheel are the signed ones, and the probe passed
    sbom = _check_beside(wheel, _byproduct(predicate, "sbom"), "SBOM")
    from patcher import vex

    vex_path = vex.check_beside(wheel, next((b for b in predicate.get("runDetails", {}).get("byproducts", [])
                                             if isinstance(b, dict) and b.get("annotations", {}).get("kind") == "vex"),
                                            None))
    probe_path = _check_beside(wheel, _byproduct(predicate, "probe-report"), "probe report")
    report = read_probe_report(probe_path)
    if not report.passed:
        raise ProbeReportNotPassedError(f"the probe report {probe_path.name} of this wheel did not pass",
                                        hint="the wheel is not proven; do not publish it")
    return VerifyResult(wheel=wheel.name, sha256=actual, keyid=keyid_of(public_key), build_id=str(build_id),
                        torch=str(torch), patches=[str(n) for n, _ in signed_series],
                        probe_report=probe_path.name, sbom=sbom.name, trust_overrides=list(overrides),
                        vex=vex_path.name, vex_states=vex.summary(vex_path))
