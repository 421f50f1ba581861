"""evidence/runs/record_run.py (the gatherer of recorded runs) and the build flag the recorded
run needs (--probe-wheelhouse).  Pure logic on small files; one docker test for the ccache
reader's refusal of a volume that does not exist."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "evidence" / "runs" / "record_run.py"


def _load():
    spec = importlib.util.spec_from_file_location("record_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record_run = _load()

PRINT_STATS = ("stats_updated_timestamp\t1796007477\ndirect_cache_hit\t72\npreprocessed_cache_hit\t3\n"
               "cache_miss\t150\ncompile_failed\t14\npreprocessor_error\t4\nfiles_in_cache\t303\n"
               "cache_size_kibibyte\t2940\n")


def _build_dir(root: Path, name: str, durations: dict[str, float], wheel_bytes: bytes = b"wheel") -> Path:
    build = root / name / "torch-1.13.1-cpu.pt1-py3.9"
    (build / "dist").mkdir(parents=True)
    wheel = build / "dist" / "torch-1.13.1+cpu.pt1-cp39-cp39-linux_x86_64.whl"
    wheel.write_bytes(wheel_bytes)
    (build / "build.log").write_text("==> wheel\n[1/1255] Building CXX object c10.o\n")
    record = {"build_id": build.name, "started": "2026-11-30T02:50:27Z", "finished": "2026-11-30T04:30:00Z",
              "completed_stages": list(durations), "stage_durations": durations,
              "patches": [{"id": "PT-0101"}, {"id": "PT-0102"}],
              "wheel": {"name": wheel.name, "path": f"dist/{wheel.name}",
                        "sha256": hashlib.sha256(wheel_bytes).hexdigest()}}
    (build / "record.json").write_text(json.dumps(record))
    return build


def test_print_stats_are_parsed_and_summarised():
    stats = record_run.parse_print_stats(PRINT_STATS)
    assert stats["direct_cache_hit"] == 72 and stats["cache_miss"] == 150
    summary = record_run.ccache_summary(stats)
    assert summary["hits"] == 75 and summary["misses"] == 150 and summary["hit_rate"] == round(75 / 225, 4)


def test_unreadable_print_stats_is_a_record_error():
    with pytest.raises(record_run.RecordError, match="printed nothing readable"):
        record_run.parse_print_stats("Usage: ccache [options]\n")


def test_ccache_delta_counts_only_what_the_second_build_added():
    before = record_run.parse_print_stats(PRINT_STATS)
    after = dict(before, direct_cache_hit=1272, cache_miss=153, files_in_cache=2700)
    delta = record_run.ccache_delta(before, after)
    assert delta["hits"] == 1200 and delta["misses"] == 3 and delta["files_in_cache"] == 2700
    assert delta["hit_rate"] == round(1200 / 1203, 4)


def test_collect_writes_run_json_with_cold_and_warm_numbers(tmp_path):
    cold = _build_dir(tmp_path, "cold", {"configure": 74.2, "wheel": 6000.0})
    warm = _build_dir(tmp_path, "warm", {"configure": 70.0, "wheel": 600.0}, wheel_bytes=b"wheel2")
    run_dir = tmp_path / "run"
    code = record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold), "--warm", str(warm),
                            "--cold-command", "patcher build --torch 1.13.1 --cuda none",
                            "--warm-change", "PT-0102 message"])
    assert code == 0
    run = json.loads((run_dir / "run.json").read_text())
    assert run["cold"]["wheel"]["sha256"] == hashlib.sha256(b"wheel").hexdigest()
    assert run["cold"]["patches"] == ["PT-0101", "PT-0102"]
    assert run["warm_vs_cold"]["wheel_cold_over_warm"] == 10.0
    assert run["warm"]["changed_patch"] == "PT-0102 message"
    # the log travels compressed, byte-identical inside
    assert gzip.decompress((run_dir / "build-cold.log.gz").read_bytes()) == (cold / "build.log").read_bytes()
    assert json.loads((run_dir / "record-warm.json").read_text())["stage_durations"]["wheel"] == 600.0


def test_collect_refuses_a_wheel_that_differs_from_its_record_and_keeps_the_old_run(tmp_path, capsys):
    cold = _build_dir(tmp_path, "cold", {"wheel": 1.0})
    run_dir = tmp_path / "run"
    assert record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold)]) == 0
    before = (run_dir / "run.json").read_bytes()
    next(cold.glob("dist/*.whl")).write_bytes(b"tampered")
    capsys.readouterr()
    assert record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("record_run: error: the cold wheel") and "its record says" in err
    assert len(err.strip().splitlines()) == 1
    assert (run_dir / "run.json").read_bytes() == before
    assert not list(run_dir.glob(".*.tmp"))


def test_collect_without_a_record_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "collect", "--run-dir", str(tmp_path / "run"),
                           "--cold", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.docker
def test_ccache_stats_and_container_of_missing_things_are_refused(tmp_path, docker_client, bullseye_base_image, no_leaks):
    out = tmp_path / "stats.json"
    code = record_run.main(["ccache-stats", "--volume", "patcher-no-such-volume-4f1c", "--image",
                            bullseye_base_image.tag, "--out", str(out)])
    assert code == 2 and not out.exists()
    assert record_run.main(["container", "--name", "patcher-no-such-container-4f1c", "--out", str(out)]) == 2
    assert not out.exists()


def test_build_refuses_a_probe_wheelhouse_that_does_not_exist_before_any_work(tmp_path):
    proc = subprocess.run([str(Path(sys.executable).with_name("patcher")), "build", "--torch", "1.13.1",
                           "--cuda", "none", "--work", str(tmp_path / "work"),
                           "--probe-wheelhouse", str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 5  # BadOptionValueError: click's bad-value usage error, in one line
    assert "--probe-wheelhouse" in proc.stderr and "does not exist" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "work").exists()


def test_progress_of_a_stage_still_running_is_read_from_the_log():
    log = ("==> configure (2026-11-30T02:50:34Z)\n==> configure done in 74.2 s: gcc\n"
           "==> wheel (2026-11-30T02:51:49Z)\n[1/4] Generating ATen sources\n"
           "[5/1255] Building CXX object c10.o\n[200/1255] Building CXX object x.o\n")
    progress = record_run.progress_from_log(log, "2026-11-30T03:11:49Z")
    assert progress["stage"] == "wheel" and progress["elapsed_s"] == 1200
    assert progress["ninja_steps_done"] == 200 and progress["ninja_steps_total"] == 1255
    assert progress["steps_per_minute"] == 10.0 and progress["minutes_left_at_that_rate"] == 106
    assert record_run.progress_from_log(log + "==> wheel done in 3600.0 s: x.whl\n", "2026-11-30T04:00:00Z") is None


def test_an_orphaned_cold_container_gives_the_cold_wheel_time(tmp_path):
    cold = _build_dir(tmp_path, "cold", {"configure": 74.2, "wheel": 900.0})  # wheel: the --resume re-run
    warm = _build_dir(tmp_path, "warm", {"configure": 70.0, "wheel": 600.0})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "cold-container.json").write_text(json.dumps({"wall_s": 7240.0, "paused_s": 1240.0, "exit_code": 0,
                                                             "wall_s_minus_pause": 6000.0}))
    assert record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold), "--warm", str(warm)]) == 0
    run = json.loads((run_dir / "run.json").read_text())
    assert run["cold"]["wheel_stage_cold_s"] == 6000.0
    assert run["cold"]["wheel_stage_rerun_from_full_ccache_s"] == 900.0
    assert run["warm_vs_cold"]["wheel_cold_over_warm"] == 10.0


# --- a build container left by a patcher process that was killed (what happened to this run) ----
@pytest.mark.docker
def test_resume_refuses_beside_a_running_leftover_container_and_removes_a_stopped_one(
        standin, bullseye_base_image, docker_client, tmp_path, patcher_cli, no_leaks):
    import shutil

    from patcher.errors import WorkDirError

    work = tmp_path / "work"
    res = patcher_cli(*standin.build_args(work, "--until", "render"), env=standin.env)
    assert res.exit_code == 0, res.stderr
    build_dir = (work / standin.build_id).absolute()
    leftover = docker_client.containers.run(
        bullseye_base_image.tag, ["sleep", "300"], detach=True, network_mode="none",
        name=f"patcher-test-leftover-{tmp_path.name[-12:]}", labels={"org.patcher.work-dir": str(build_dir),
                                                                     "org.patcher.stage": "wheel"})
    try:
        res = patcher_cli(*standin.build_args(work, "--resume", "--until", "image"), env=standin.env)
        assert res.exit_code == WorkDirError.exit_code, res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("patcher: error:")]
        assert len(errors) == 1 and "Traceback" not in res.stderr
        assert f"container {leftover.name} of an earlier build" in errors[0] and "still running" in errors[0]
        leftover.reload()
        assert leftover.status == "running"  # never stopped by the refusal
        record = json.loads((build_dir / "record.json").read_text())
        assert record["completed_stages"][-1] == "render"

        leftover.kill()
        # A catalog whose template differs makes the image stage refuse at once (no image build):
        # the stopped leftover must be gone by then.
        catalog = tmp_path / "catalog"
        shutil.copytree(standin.catalog / "patches", catalog / "patches")
        shutil.copytree(REPO_ROOT / "dockerfiles", catalog / "dockerfiles")
        template = catalog / "dockerfiles" / "builder.Dockerfile.j2"
        template.write_text(template.read_text() + "# changed after render\n")
        env = dict(standin.env, PATCHER_CATALOG=str(catalog))
        res = patcher_cli(*standin.build_args(work, "--resume", "--until", "image"), env=env)
        assert f"removing container {leftover.name} left exited" in res.stderr
        assert res.exit_code == WorkDirError.exit_code and "rendered Dockerfile changed" in res.stderr
        assert not docker_client.containers.list(all=True, filters={"label": f"org.patcher.work-dir={build_dir}"})
    finally:
        try:
            leftover.remove(force=True)
        except Exception:  # noqa: BLE001 - removed by the build, as asserted
            pass


def test_a_cold_container_that_was_killed_gives_no_cold_wheel_time(tmp_path):
    cold = _build_dir(tmp_path, "cold", {"configure": 74.2})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "cold-container.json").write_text(json.dumps({"wall_s": 3343.0, "exit_code": 137,
                                                             "wall_s_minus_pause": 2100.0}))
    assert record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold)]) == 0
    run = json.loads((run_dir / "run.json").read_text())
    assert run["cold"]["wheel_stage_cold_s"] is None and run["cold_container"]["exit_code"] == 137


def test_until_a_stage_already_done_stops_there(standin, tmp_path, patcher_cli):
    """`--resume --until configure` on a build past configure must not go on into the wheel."""
    work = tmp_path / "work"
    assert patcher_cli(*standin.build_args(work, "--until", "render"), env=standin.env).exit_code == 0
    before = (work / standin.build_id / "record.json").read_text()
    res = patcher_cli(*standin.build_args(work, "--resume", "--until", "patch"), env=standin.env)
    assert res.exit_code == 0, res.stderr
    assert "patch was already done; stopped there as asked" in res.stderr
    assert json.loads((work / standin.build_id / "record.json").read_text())["completed_stages"] == \
        json.loads(before)["completed_stages"]


@pytest.mark.docker
def test_resume_builds_a_removed_builder_image_again(standin, docker_client, tmp_path, patcher_cli, no_leaks,
                                                     ccache_volume_name):
    """What this run met: the builder image was removed between the stages of one build."""
    import shutil

    from patcher.errors import WheelBuildError

    # A minimal builder image (no toolchain): enough for the image stage, instant to build.
    catalog = tmp_path / "catalog"
    shutil.copytree(standin.catalog / "patches", catalog / "patches")
    (catalog / "dockerfiles").mkdir()
    (catalog / "dockerfiles" / "builder.Dockerfile.j2").write_text(
        f"FROM {{{{ from_ref | image_ref }}}}\nLABEL org.patcher.test-minimal={tmp_path.name[-12:]}\n")
    env = dict(standin.env, PATCHER_CATALOG=str(catalog))
    work = tmp_path / "work"
    record_path = work / standin.build_id / "record.json"
    image_ids = set()
    try:
        res = patcher_cli(*standin.build_args(work, "--until", "image"), env=env)
        assert res.exit_code == 0, res.stderr
        first = json.loads(record_path.read_text())["image_id"]
        image_ids.add(first)
        docker_client.images.remove(first, force=True)
        # configure then fails (this image has no builder user), after the image stage ran again
        res = patcher_cli(*standin.build_args(work, "--resume", "--until", "configure",
                                              "--ccache-volume", ccache_volume_name), env=env)
        assert "is gone; building it again" in res.stderr, res.stderr
        assert "[image] done" in res.stderr
        assert res.exit_code == WheelBuildError.exit_code, res.stderr
        record = json.loads(record_path.read_text())
        assert "image" in record["completed_stages"] and record["image_id"]
        image_ids.add(record["image_id"])
        docker_client.images.get(record["image_id"])  # it exists again
    finally:
        for image_id in image_ids:
            try:
                docker_client.images.remove(image_id, force=True)
            except Exception:  # noqa: BLE001 - already removed above
                pass


def _failed_attempt(root: Path, name: str, stopped_at: float) -> Path:
    import os

    build = root / name / "torch-1.13.1-cpu.pt1-py3.9"
    build.mkdir(parents=True)
    (build / "build.log").write_text(
        "==> configure (2026-11-30T05:20:00Z)\n==> configure done in 59.0 s: gcc\n==> wheel (2026-11-30T05:21:00Z)\n"
        "[1/1255] Building CXX object c10.o\n[919/1255] Building CXX object flatbuffer_loader.cpp.o\n"
        "patcher: error: wheel failed in the container (exit 1): mobile_bytecode_generated.h:2548: error\n")
    os.utime(build / "build.log", (stopped_at, stopped_at))
    (build / "record.json").write_text(json.dumps({
        "build_id": build.name, "completed_stages": ["configure"], "stage_durations": {"configure": 59.0},
        "patches": [{"id": "PT-0101"}]}))
    return build


def test_failed_cold_attempts_add_their_wheel_time_to_the_cold_time(tmp_path):
    from datetime import datetime, timezone

    stopped = datetime(2026, 11, 30, 6, 42, 40, tzinfo=timezone.utc).timestamp()  # 4,900 s after 05:21:00
    attempt = _failed_attempt(tmp_path, "attempt", stopped)
    cold = _build_dir(tmp_path, "cold", {"configure": 36.0, "wheel": 1500.0})
    warm = _build_dir(tmp_path, "warm", {"configure": 36.0, "wheel": 640.0}, wheel_bytes=b"wheel2")
    run_dir = tmp_path / "run"
    assert record_run.main(["collect", "--run-dir", str(run_dir), "--cold", str(cold), "--warm", str(warm),
                            "--cold-attempt", str(attempt)]) == 0
    run = json.loads((run_dir / "run.json").read_text())
    (part,) = run["cold_attempts"]
    assert part["wheel_s"] == 4900.0 and part["ninja_steps_reached"] == 919 and part["ninja_steps_total"] == 1255
    assert "mobile_bytecode_generated.h:2548" in part["error"]
    assert run["cold"]["wheel_stage_final_attempt_s"] == 1500.0
    assert run["cold"]["wheel_stage_cold_s"] == 6400.0
    assert run["warm_vs_cold"]["wheel_cold_s"] == 6400.0 and run["warm_vs_cold"]["wheel_cold_over_warm"] == 10.0
    assert (run_dir / "record-cold-attempt-1.json").is_file()
    assert gzip.decompress((run_dir / "build-cold-attempt-1.log.gz").read_bytes()) == (attempt / "build.log").read_bytes()


def test_a_cold_attempt_that_did_not_fail_in_its_wheel_stage_is_refused(tmp_path, capsys):
    attempt = _failed_attempt(tmp_path, "attempt", 0)
    (attempt / "build.log").write_text("==> configure (2026-11-30T05:20:00Z)\npatcher: error: configure failed\n")
    cold = _build_dir(tmp_path, "cold", {"wheel": 1.0})
    code = record_run.main(["collect", "--run-dir", str(tmp_path / "run"), "--cold", str(cold),
                            "--cold-attempt", str(attempt)])
    assert code == 2
    assert "did not fail in its wheel stage" in capsys.readouterr().err
