"""Running every check into one report, and rendering it as JSON, JUnit XML and a table.

The report (schema 1) is the contract with the host (``patcher.probing.ProbeReport``) and
the evidence stage:

    {"schema": 1, "probe_version", "started" (ISO 8601 UTC), "duration_s",
     "environment": {...the env.fingerprint details...}, "patched_ids": [...],
     "checks": [{"id", "status": "pass|fail|skip|error", "required", "message", "details",
                 "patches", "duration_s", "finding"}],
     "summary": {"pass", "fail", "skip", "error"}, "passed": bool}

``finding`` marks a failure that is a known-defect observation (``Finding``); it fails the
run only when ``required`` is true.  ``passed`` is true when no required check failed or
errored.  The renderers take the plain dict, so the host renders a loaded report with the
same code.
"""

import datetime
import fnmatch
import json
import os
import time
import xml.etree.ElementTree as ET

from . import PROBE_VERSION, SCHEMA, framework, load_checks


def select(specs, only):
    """Checks whose id matches one of the comma-separated patterns ('env,maxpool2d.sweep')."""
    if not only:
        return specs
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    # 'determinism' selects every determinism.* check; globs work as in a shell
    return [s for s in specs
            if any(fnmatch.fnmatchcase(s.id, p) or fnmatch.fnmatchcase(s.id, p + ".*") for p in patterns)]


def run_all(torch, patched_ids=(), budget=None, only=None, progress=None, server=None):
    """Run the applicable checks and return the report dict.

    ``server``: a ``workers.Server`` started beforehand (``workers.start_server``); the checks
    it can take run in its worker processes, concurrently, and it is closed here.  Without
    one, every check runs from this process (isolated ones each in a fresh interpreter)."""
    load_checks()
    from .checks.env import collect_fingerprint

    started_wall = datetime.datetime.now(datetime.timezone.utc)
    started = time.time()
    ctx = framework.Context(torch, patched_ids)
    specs = select(framework.registry(), only)
    here = set(spec.id for spec in specs)
    try:
        if server is not None:
            from . import workers

            server.mark("context", has_cuda=bool(ctx.has_cuda))
            here, groups = workers.plan(specs, ctx)
            server.begin(ctx, started, budget)
            for group in groups:
                server.submit(group)
            server.mark("submitted")
        environment = collect_fingerprint(torch, ctx.has_cuda, cross_check=False)
        if server is not None:
            server.mark("fingerprint")
        checks = []
        for spec in specs:
            entry = server.entry(spec) if server is not None and spec.id not in here else None
            if entry is None:  # this process's own, or the server could not run it
                remaining = None if budget is None else budget - (time.time() - started)
                entry = framework.run_spec(spec, ctx, remaining)
            checks.append(entry)
            if server is not None and spec.id in here:
                server.mark("here", id=spec.id, status=entry["status"], seconds=entry.get("duration_s"))
            if progress is not None:
                progress(entry)
    finally:
        if server is not None:
            server.close()
    return build_report(checks, environment, patched_ids, started_wall, time.time() - started)


def build_report(checks, environment, patched_ids, started_wall, duration):
    summary = dict((status, 0) for status in framework.STATUSES)
    for entry in checks:
        summary[entry["status"]] += 1
    passed = not any(entry["required"] and entry["status"] in ("fail", "error") for entry in checks)
    return {
        "schema": SCHEMA,
        "probe_version": PROBE_VERSION,
        "started": started_wall.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": round(duration, 3),
        "environment": environment,
        "patched_ids": sorted(patched_ids),
        "checks": checks,
        "summary": summary,
        "passed": passed,
    }


# --- writing -------------------------------------------------------------------------------
def write_atomic(path, text):
    """Write to a temp name beside ``path`` and rename: a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    try:
        with open(temp, "w") as handle:
            handle.write(text)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def to_json(report):
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def to_junit(report):
    """JUnit XML for CI dashboards.  A failed required check is a <failure>, an error an
    <error>, a skip <skipped>; a failed check that is not required (a finding the wheel is
    not expected to fix) is reported as passing, with the finding in <system-out>, so that
    the XML gates exactly as ``passed`` does."""
    checks = report["checks"]
    failures = sum(1 for c in checks if c["status"] == "fail" and c["required"])
    errors = sum(1 for c in checks if c["status"] == "error" and c["required"])
    skipped = sum(1 for c in checks if c["status"] == "skip")
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", {
        "name": "patcher.probe", "tests": str(len(checks)), "failures": str(failures),
        "errors": str(errors), "skipped": str(skipped), "time": "%.3f" % report["duration_s"],
        "timestamp": report["started"]})
    properties = ET.SubElement(suite, "properties")
    torch_info = report.get("environment", {}).get("torch", {})
    for name, value in (("torch", torch_info.get("version")), ("torch_git", torch_info.get("git_version")),
                        ("patched_ids", ",".join(report.get("patched_ids", []))),
                        ("probe_version", report.get("probe_version"))):
        ET.SubElement(properties, "property", {"name": name, "value": str(value)})
    for entry in checks:
        case = ET.SubElement(suite, "testcase", {
            "classname": "probe." + entry["id"].split(".")[0], "name": entry["id"],
            "time": "%.3f" % entry["duration_s"]})
        message = entry["message"] or ""
        if entry["status"] == "skip":
            ET.SubElement(case, "skipped", {"message": message})
        elif entry["status"] in ("fail", "error") and entry["required"]:
            tag = "failure" if entry["status"] == "fail" else "error"
            node = ET.SubElement(case, tag, {"message": message,
                                             "type": "finding" if entry.get("finding") else entry["status"]})
            node.text = json.dumps(entry["details"], indent=1, sort_keys=True) if entry["details"] else message
        elif entry["status"] in ("fail", "error"):
            out = ET.SubElement(case, "system-out")
            out.text = "%s (not required): %s" % ("finding" if entry.get("finding") else entry["status"], message)
    return ET.tostring(suites, encoding="unicode") + "\n"


def status_label(entry):
    label = entry["status"].upper()
    if entry["status"] in ("fail", "error") and not entry["required"]:
        label += " (optional)"
    if entry.get("finding"):
        label += " finding"
    return label


def to_table(report):
    """A fixed-width table (no colour: it is read in CI logs and pasted into audits)."""
    rows = [[entry["id"], status_label(entry), "yes" if entry["required"] else "no",
             "%.2f" % entry["duration_s"], entry["message"] or ""] for entry in report["checks"]]
    header = ["check", "status", "required", "seconds", "message"]
    widths = [max([len(header[i])] + [len(row[i]) for row in rows]) for i in range(4)]
    lines = []
    for row in [header, ["-" * w for w in widths] + ["-------"]] + rows:
        lines.append("  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip())
    summary = report["summary"]
    env = report.get("environment", {})
    lines.append("")
    lines.append("torch %s (git %s), python %s, CUDA %s: %d pass, %d fail, %d skip, %d error in %.1f s -> %s" % (
        env.get("torch", {}).get("version"), env.get("torch", {}).get("git_version"),
        env.get("python", {}).get("version"), env.get("cuda", {}).get("compiled"),
        summary["pass"], summary["fail"], summary["skip"], summary["error"], report["duration_s"],
        "PASSED" if report["passed"] else "FAILED"))
    return "\n".join(lines) + "\n"
