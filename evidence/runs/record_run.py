"""Gather the record of one real `patcher build` run into a folder under evidence/runs/.

The build itself already keeps its state in ``<work>/<build-id>/record.json`` (stages, stage
times, wheel sha256, patches, toolchain) and its log in ``build.log``; this script only copies
what matters into the run folder, checks it, and adds what the record cannot know (ccache
statistics, the probe/certify/publish steps, the warm rebuild).  Nothing here builds anything.

    python evidence/runs/record_run.py ccache-stats --volume V --image IMG --out FILE
        `ccache --print-stats` of a ccache volume, read in a throwaway container (removed
        afterwards, network off, volume mounted read-only), written as JSON.

    python evidence/runs/record_run.py collect --run-dir DIR --cold WORK/BUILD-ID
            [--warm WORK/BUILD-ID] [--cold-command CMD] [--warm-command CMD] ...
        Copies record.json and build.log (gzip) of each build, re-hashes the wheel and compares
        it with the record, copies the probe report and the evidence files found in DIR/steps,
        and writes DIR/run.json with the numbers (stage times, cold vs warm, ccache deltas).

Every failure is one line on stderr and exit status 2; files are written to a temp name and
renamed, so a failed run leaves the previous record intact.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA = 1


class RecordError(Exception):
    """A one-line reason the record cannot be made."""


# --- small helpers --------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes | str) -> None:
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def gzip_copy(src: Path, dest: Path) -> None:
    """gzip with a fixed mtime and no file name inside: the same log gives the same bytes."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out, \
                open(src, "rb") as fh:
            shutil.copyfileobj(fh, out, 1 << 20)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{what} {path} does not exist") from None
    except ValueError as exc:
        raise RecordError(f"{what} {path} is not JSON: {exc}") from None


# --- ccache ---------------------------------------------------------------------------------------
def parse_print_stats(text: str) -> dict[str, int]:
    """ccache >= 4 `--print-stats`: one 'name<TAB>value' a line."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("\t")
        if sep and value.strip().lstrip("-").isdigit():
            stats[name.strip()] = int(value)
    if not stats:
        raise RecordError("ccache --print-stats printed nothing readable (ccache older than 4.0?)")
    return stats


def ccache_summary(stats: dict[str, int]) -> dict[str, Any]:
    hits = stats.get("direct_cache_hit", 0) + stats.get("preprocessed_cache_hit", 0)
    misses = stats.get("cache_miss", 0)
    total = hits + misses
    return {"hits": hits, "direct_hits": stats.get("direct_cache_hit", 0),
            "preprocessed_hits": stats.get("preprocessed_cache_hit", 0), "misses": misses,
            "hit_rate": round(hits / total, 4) if total else None,
            "files_in_cache": stats.get("files_in_cache"), "cache_size_kib": stats.get("cache_size_kibibyte")}


def ccache_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """What one build added to the volume's counters (the counters are cumulative)."""
    keys = ("direct_cache_hit", "preprocessed_cache_hit", "cache_miss", "compile_failed", "preprocessor_error")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    return ccache_summary({**delta, "files_in_cache": after.get("files_in_cache", 0),
                           "cache_size_kibibyte": after.get("cache_size_kibibyte", 0)}) | {
        "compile_failed": delta["compile_failed"], "preprocessor_error": delta["preprocessor_error"]}


def read_ccache_stats(volume: str, image: str) -> dict[str, Any]:
    """Run `ccache --print-stats` and `ccache -s` against ``volume`` in a throwaway container."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise RecordError(f"the Docker engine is not reachable: {exc}") from None
    try:
        try:
            client.volumes.get(volume)
        except docker.errors.NotFound:
            raise RecordError(f"ccache volume {volume} does not exist") from None
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise RecordError(f"image {image} is not on this machine") from None
        container = None
        try:
            container = client.containers.create(
                image, command=["sh", "-c", "ccache --version | head -n 1; echo ==; ccache --print-stats; "
                                            "echo ==; ccache -s"],
                environment={"CCACHE_DIR": "/ccache"}, network_mode="none", user="1000",
                volumes={volume: {"bind": "/ccache", "mode": "ro"}}, entrypoint=[],
                name=f"patcher-record-ccache-{uuid.uuid4().hex[:8]}", labels={"org.patcher.record-run": "1"})
            container.start()
            status = container.wait(timeout=120)["StatusCode"]
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            if container is not None:
                container.remove(force=True)
    finally:
        client.close()
    if status != 0:
        raise RecordError(f"ccache in {image} exited with {status}: {output.strip().splitlines()[-1:]}")
    version, print_stats, human = (output.split("==\n") + ["", ""])[:3]
    stats = parse_print_stats(print_stats)
    return {"volume": volume, "ccache_version": version.strip(), "taken": utc_now(), "stats": stats,
            "summary": ccache_summary(stats), "ccache_s": human.rstrip("\n")}


# --- a build container -----------------------------------------------------------------------------
def read_container(name: str) -> dict[str, Any]:
    """Times, exit status and patcher labels of a (finished) build container, from the engine."""
    import docker

    try:
        client = docker.from_env()
        attrs = client.api.inspect_container(name)
    except docker.errors.NotFound:
        raise RecordError(f"container {name} does not exist") from None
    except docker.errors.DockerException as exc:
        raise RecordError(f"the Docker engine is not reachable: {exc}") from None
    state = attrs["State"]
    labels = attrs["Config"].get("Labels") or {}
    finished = None if state.get("Running") else state.get("FinishedAt")
    started = state.get("StartedAt")
    trim = lambda s: s.split(".")[0] + "Z" if s and "." in s else s  # noqa: E731 - docker gives ns
    out = {"name": attrs["Name"].lstrip("/"), "image": attrs["Config"].get("Image"),
           "build_id": labels.get("org.patcher.build-id"), "stage": labels.get("org.patcher.stage"),
           "work_dir": labels.get("org.patcher.work-dir"), "started": trim(started),
           "finished": trim(finished), "running": bool(state.get("Running")), "paused": bool(state.get("Paused")),
           "exit_code": None if state.get("Running") else state.get("ExitCode")}
    out["wall_s"] = _seconds_between(out["started"], out["finished"])
    # How far ninja got: its last "[N/M]" line, with the time the engine stamped on it.
    tail = client.api.logs(name, stdout=True, stderr=True, timestamps=True, tail=200).decode("utf-8", "replace")
    for line in reversed(tail.splitlines()):
        stamp, _, text = line.partition(" ")
        step = _NINJA_STEP.match(text)
        if step:
            out.update(ninja_steps_done=int(step.group(1)), ninja_steps_total=int(step.group(2)),
                       ninja_last_step_at=stamp.split(".")[0] + "Z")
            break
    client.close()
    return out


# --- builds ---------------------------------------------------------------------------------------
def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def collect_build(build_dir: Path, run_dir: Path, label: str) -> dict[str, Any]:
    """Copy one build's record and log into the run folder; return its numbers."""
    record = load_json(build_dir / "record.json", f"the {label} build record")
    out: dict[str, Any] = {
        "build_id": record.get("build_id"), "work_dir": str(build_dir),
        "started": record.get("started"), "finished": record.get("finished"),
        "completed_stages": record.get("completed_stages", []),
        "stage_durations_s": record.get("stage_durations", {}),
        "stages_total_s": round(sum(record.get("stage_durations", {}).values()), 1),
        "patches": [p["id"] for p in record.get("patches", [])],
        "toolchain": record.get("toolchain", {}), "image_tag": record.get("image_tag"),
        "image_reused": record.get("image_reused"), "container_env": record.get("container_env", {}),
    }
    # `started` is the first run's start; after a --resume the sum of stage times is the build.
    out["wall_s_first_start_to_last_stage"] = _seconds_between(record.get("started"), record.get("finished"))
    wheel = record.get("wheel")
    if wheel:
        path = build_dir / wheel["path"]
        if not path.is_file():
            raise RecordError(f"the {label} wheel {path} named in the record does not exist")
        actual = sha256_file(path)
        if actual != wheel["sha256"]:
            raise RecordError(f"the {label} wheel {path.name} has sha256 {actual}, its record says {wheel['sha256']}")
        out["wheel"] = {"name": wheel["name"], "sha256": actual, "size_bytes": path.stat().st_size}
    write_json(run_dir / f"record-{label}.json", record)
    log = build_dir / "build.log"
    if log.is_file() and "wheel" not in out["completed_stages"]:
        out["in_progress"] = progress_from_log(log.read_text(encoding="utf-8", errors="replace"), utc_now())
    if log.is_file():
        gzip_copy(log, run_dir / f"build-{label}.log.gz")
        out["log"] = {"file": f"build-{label}.log.gz", "sha256_uncompressed": sha256_file(log),
                      "lines": sum(1 for _ in open(log, "rb"))}
    return out


_STAGE_START = re.compile(r"^==> (\w+) \((\d{4}-\d\d-\d\dT[\d:]+Z)\)$", re.M)
_STAGE_DONE = re.compile(r"^==> (\w+) done in ", re.M)
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] ", re.M)


def progress_from_log(text: str, now: str) -> dict[str, Any] | None:
    """For a build still running (or stopped) in a stage: which stage, since when, and how far
    ninja got ("[N/M]" lines), with the rate so far and the time left at that rate."""
    starts = _STAGE_START.findall(text)
    if not starts:
        return None
    stage, started = starts[-1]
    if stage in _STAGE_DONE.findall(text):
        return None
    elapsed = _seconds_between(started, now) or 0.0
    body = text[text.rfind(f"==> {stage} ("):]
    steps = _NINJA_STEP.findall(body)
    out: dict[str, Any] = {"stage": stage, "stage_started": started, "as_of": now, "elapsed_s": round(elapsed)}
    if steps:
        done, total = (int(x) for x in steps[-1])
        out.update(ninja_steps_done=done, ninja_steps_total=total)
        if elapsed > 0 and done:
            rate = done / (elapsed / 60)
            out.update(steps_per_minute=round(rate, 2), minutes_left_at_that_rate=round((total - done) / rate))
    return out


_ERROR_LINE = re.compile(r"^patcher: error: (.*)$", re.M)


def collect_failed_attempt(build_dir: Path, run_dir: Path, number: int) -> dict[str, Any]:
    """An earlier attempt of the cold build that failed in its wheel stage, into the same ccache
    volume: how long its wheel stage compiled, how far ninja got and why it stopped.  Its log's
    last write is when it stopped (the record keeps no time for a stage that failed)."""
    label = f"cold-attempt-{number}"
    record = load_json(build_dir / "record.json", f"the {label} build record")
    log = build_dir / "build.log"
    if not log.is_file():
        raise RecordError(f"the {label} build has no log {log}")
    text = log.read_text(encoding="utf-8", errors="replace")
    starts = dict(_STAGE_START.findall(text))
    if "wheel" not in starts or "wheel" in _STAGE_DONE.findall(text):
        raise RecordError(f"the {label} build {build_dir} did not fail in its wheel stage")
    stopped = datetime.fromtimestamp(log.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    steps = _NINJA_STEP.findall(text[text.rfind("==> wheel ("):])
    errors = _ERROR_LINE.findall(text)
    write_json(run_dir / f"record-{label}.json", record)
    gzip_copy(log, run_dir / f"build-{label}.log.gz")
    return {"work_dir": str(build_dir), "patches": [p["id"] for p in record.get("patches", [])],
            "stage_durations_s": record.get("stage_durations", {}), "wheel_started": starts["wheel"],
            "wheel_stopped": stopped, "wheel_s": _seconds_between(starts["wheel"], stopped),
            "ninja_steps_reached": int(steps[-1][0]) if steps else None,
            "ninja_steps_total": int(steps[-1][1]) if steps else None,
            "error": errors[-1][:400] if errors else None,
            "log": {"file": f"build-{label}.log.gz", "sha256_uncompressed": sha256_file(log)}}


def probe_summary(report_path: Path) -> dict[str, Any]:
    report = load_json(report_path, "the probe report")
    checks = [{"id": c["id"], "status": c["status"], "required": c["required"], "patches": c.get("patches", []),
               "message": (c.get("message") or "")[:300]} for c in report.get("checks", [])]
    return {"file": report_path.name, "passed": report.get("passed"), "summary": report.get("summary"),
            "patched_ids": report.get("patched_ids"), "torch": (report.get("environment") or {}).get("torch"),
            "python": (report.get("environment") or {}).get("python"), "checks": checks,
            "required_failed": [c["id"] for c in checks if c["required"] and c["status"] in ("fail", "error")]}


def host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(), "machine": platform.machine()}
    try:
        facts["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    try:
        facts["docker"] = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                         capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        facts["docker"] = None
    try:
        facts["os"] = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines()
                           if "=" in line).get("PRETTY_NAME", "").strip('"')
    except OSError:
        pass
    return facts


def collect(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    existing = load_json(run_dir / "run.json", "run.json") if (run_dir / "run.json").is_file() else {}
    run: dict[str, Any] = {"schema": SCHEMA, "run": run_dir.name, "recorded": utc_now(), "host": host_facts(),
                           "notes": args.note or existing.get("notes", [])}
    cold = collect_build(Path(args.cold), run_dir, "cold")
    cold["command"] = args.cold_command
    run["cold"] = cold
    cold_wheel_s = cold["stage_durations_s"].get("wheel")
    if (run_dir / "cold-container.json").is_file():
        # The cold wheel stage ran in a container whose patcher process died: its time comes from
        # the engine, and the record's wheel stage is the re-run from a filled ccache (--resume).
        container = load_json(run_dir / "cold-container.json", "cold-container.json")
        run["cold_container"] = container
        cold.pop("in_progress", None)  # the log stopped with its patcher process; the engine knows more
        if container.get("exit_code") == 0:
            cold_wheel_s = container.get("wall_s_minus_pause") or container.get("wall_s")
            cold["wheel_stage_rerun_from_full_ccache_s"] = cold["stage_durations_s"].get("wheel")
        else:  # it never finished: there is no cold wheel time
            cold_wheel_s = None
    if args.cold_attempt:
        # The cold build ran in parts: earlier attempts stopped in the wheel stage on a build
        # error, were fixed by a patch, and the next one went on from the same ccache volume.
        # Its cold wheel time is the sum of every part.
        attempts = [collect_failed_attempt(Path(d), run_dir, i) for i, d in enumerate(args.cold_attempt, start=1)]
        run["cold_attempts"] = attempts
        if cold_wheel_s is not None:
            cold["wheel_stage_final_attempt_s"] = cold_wheel_s
            cold_wheel_s = round(sum(a["wheel_s"] for a in attempts) + cold_wheel_s, 3)
    cold["wheel_stage_cold_s"] = cold_wheel_s
    if args.warm:
        warm = collect_build(Path(args.warm), run_dir, "warm")
        warm["command"] = args.warm_command
        warm["changed_patch"] = args.warm_change
        run["warm"] = warm
        ratios: dict[str, Any] = {}
        for stage, c in (("configure", cold["stage_durations_s"].get("configure")), ("wheel", cold_wheel_s)):
            w = warm["stage_durations_s"].get(stage)
            if c and w:
                ratios[f"{stage}_cold_s"], ratios[f"{stage}_warm_s"] = c, w
                ratios[f"{stage}_cold_over_warm"] = round(c / w, 2)
        run["warm_vs_cold"] = ratios
    # ccache snapshots in the order they were taken; each build's own counts are the differences
    snapshots = [(name, load_json(run_dir / f"ccache-after-{name}.json", "ccache stats")["stats"])
                 for name in ("cold", "resume", "warm") if (run_dir / f"ccache-after-{name}.json").is_file()]
    for i, (name, stats) in enumerate(snapshots):
        run[f"ccache_after_{name}"] = ccache_summary(stats)
        if i:
            run[f"ccache_{name}_build"] = ccache_delta(snapshots[i - 1][1], stats)
    probe = run_dir / "evidence" / (cold.get("wheel", {}).get("name", "") + ".probe.json")
    if args.probe_report:
        probe = Path(args.probe_report)
    if probe.is_file():
        run["probe"] = probe_summary(probe)
    evidence_dir = run_dir / "evidence"
    if evidence_dir.is_dir():
        run["evidence_files"] = {p.name: sha256_file(p) for p in sorted(evidence_dir.iterdir()) if p.is_file()}
    steps = run_dir / "steps"
    if steps.is_dir():
        run["steps"] = sorted(p.name for p in steps.iterdir() if p.is_file())
    write_json(run_dir / "run.json", run)
    return run


# --- command line ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="record_run.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cc = sub.add_parser("ccache-stats", help="ccache statistics of a volume, as JSON")
    cc.add_argument("--volume", required=True)
    cc.add_argument("--image", required=True, help="an image that has ccache (the builder image)")
    cc.add_argument("--out", required=True)
    ct = sub.add_parser("container", help="times and exit status of a build container, as JSON")
    ct.add_argument("--name", required=True)
    ct.add_argument("--out", required=True)
    ct.add_argument("--note", action="append", default=None, help="a sentence kept with it (repeatable)")
    ct.add_argument("--paused-s", type=float, default=None,
                    help="seconds the container spent paused (docker records no pause time)")
    co = sub.add_parser("collect", help="gather the run's record into its folder")
    co.add_argument("--run-dir", required=True)
    co.add_argument("--cold", required=True, help="the cold build's directory (<work>/<build-id>)")
    co.add_argument("--cold-command", default=None)
    co.add_argument("--cold-attempt", action="append", default=None,
                    help="an earlier attempt of the cold build that failed in its wheel stage (repeatable, in order)")
    co.add_argument("--warm", default=None, help="the warm rebuild's directory")
    co.add_argument("--warm-command", default=None)
    co.add_argument("--warm-change", default=None, help="what was changed before the warm rebuild")
    co.add_argument("--probe-report", default=None)
    co.add_argument("--note", action="append", default=None, help="a sentence for run.json's notes (repeatable)")
    args = parser.parse_args(argv)
    try:
        if args.command == "ccache-stats":
            result = read_ccache_stats(args.volume, args.image)
            write_json(Path(args.out), result)
            print(f"ccache {args.volume}: {json.dumps(result['summary'], sort_keys=True)}")
        elif args.command == "container":
            result = read_container(args.name)
            if args.note:
                result["notes"] = args.note
            if args.paused_s is not None:
                result["paused_s"] = args.paused_s
                if result["wall_s"] is not None:
                    result["wall_s_minus_pause"] = round(result["wall_s"] - args.paused_s, 1)
            write_json(Path(args.out), result)
            print(f"container {result['name']}: started {result['started']}, finished {result['finished']}, "
                  f"exit {result['exit_code']}")
        else:
            run = collect(args)
            wheel = run["cold"].get("wheel") or {}
            print(f"wrote {Path(args.run_dir) / 'run.json'}: wheel {wheel.get('name')} sha256 {wheel.get('sha256')}")
    except RecordError as exc:
        print(f"record_run: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
