"""The probe's worker processes (patcher/probe/workers.py) with Debian's real torch: the same
report as one check at a time, crash isolation for every check, concurrency, the fallback
when the server stops.  No timed assertions: concurrency is shown by two checks that can only
pass together."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SITE_CHECKS = '''
import os, signal, time
from patcher.probe.framework import check

def _wait_for(path, seconds=60):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True

@check("site.crash_in_module")
def crash_in_module(ctx):
    os.kill(os.getpid(), signal.SIGFPE)

@check("site.after_crash")
def after_crash(ctx):
    ctx.log("still here")
    return {"ok": True}

@check("site.blocked_hang", timeout=1)
def blocked_hang(ctx):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # what a hang in C code looks like
    time.sleep(60)

@check("site.after_hang")
def after_hang(ctx):
    return None

@check("site.meet_a", isolate=True, timeout=60)
def meet_a(ctx):
    open(os.path.join(os.environ["PROBE_TEST_DIR"], "a"), "w").close()
    return {"met": _wait_for(os.path.join(os.environ["PROBE_TEST_DIR"], "b"), 8)}

@check("site.meet_b", isolate=True, timeout=60)
def meet_b(ctx):
    open(os.path.join(os.environ["PROBE_TEST_DIR"], "b"), "w").close()
    return {"met": _wait_for(os.path.join(os.environ["PROBE_TEST_DIR"], "a"), 8)}

@check("site.stop_the_server", isolate=True)
def stop_the_server(ctx):
    with open("/proc/%d/cmdline" % os.getppid(), "rb") as handle:
        parent = handle.read()
    if b"--fork-server" in parent:  # in a worker: stop the server under it
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(1)
    return {"parent_was_server": b"--fork-server" in parent}
'''


def run_probe(python, tmp_path, only, *args, isolation=None):
    (tmp_path / "site_workers.py").write_text(textwrap.dedent(SITE_CHECKS))
    meet = tmp_path / "meet"
    meet.mkdir(exist_ok=True)
    for name in ("a", "b"):
        (meet / name).unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", PATCHER_PROBE_EXTRA_CHECKS="site_workers",
               PROBE_TEST_DIR=str(meet))
    env.pop("PATCHER_PROBE_ISOLATION", None)
    if isolation:
        env["PATCHER_PROBE_ISOLATION"] = isolation
    proc = subprocess.run([python, "-m", "patcher.probe", "--only", only, *args, "--json", "-"], env=env,
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    return proc, report, {c["id"]: c for c in report["checks"]}


# both read past a table in the unpatched torch: what kills the process (SIGSEGV, SIGABRT from the
# allocator, or nothing but the check's own detection) depends on where memory happens to lie
LAYOUT_DEPENDENT = {"security.cve_2024_31580", "security.cve_2024_31583"}


def test_workers_give_the_same_report_as_one_check_at_a_time(system_torch_python, tmp_path):
    only = "env.fingerprint,security"
    _, forked, by_fork = run_probe(system_torch_python, tmp_path, only)
    _, spawned, by_spawn = run_probe(system_torch_python, tmp_path, only, isolation="spawn")
    assert list(by_fork) == list(by_spawn)
    assert len(by_fork) > 5 and any(c["status"] == "fail" for c in forked["checks"])
    for check_id, entry in by_fork.items():
        other = by_spawn[check_id]
        if check_id in LAYOUT_DEPENDENT:
            # it reads past a table: the unpatched torch either dies of it or is caught using the
            # operand, by where memory happens to lie; both are the defect found
            assert entry["status"] == other["status"] == "fail" and entry["required"] == other["required"], check_id
            continue
        assert (entry["status"], entry["message"], entry["required"], entry["finding"]) == \
            (other["status"], other["message"], other["required"], other["finding"]), check_id
    assert (forked["summary"], forked["passed"]) == (spawned["summary"], spawned["passed"])


def test_a_crash_or_a_hang_in_a_module_worker_loses_no_other_result(system_torch_python, tmp_path):
    proc, report, got = run_probe(system_torch_python, tmp_path,
                                  "env.fingerprint,site.crash_in_module,site.after_crash,site.blocked_hang,"
                                  "site.after_hang")
    assert got["env.fingerprint"]["status"] == "pass"
    # the site module ran in a worker; its crash took only the check that crashed
    assert (got["site.crash_in_module"]["status"], got["site.crash_in_module"]["message"]) == \
        ("fail", "killed by SIGFPE (exit -8)")
    assert got["site.after_crash"]["status"] == "pass"
    assert got["site.after_crash"]["details"] == {"ok": True, "log": ["still here"]}
    # a hang the in-process alarm cannot break: the server kills the worker past the grace period
    assert (got["site.blocked_hang"]["status"], got["site.blocked_hang"]["message"]) == \
        ("fail", "timed out after 1 s (child process killed)")
    assert got["site.after_hang"]["status"] == "pass"
    assert report["passed"] is False and proc.returncode == 1


def test_isolated_checks_run_at_the_same_time(system_torch_python, tmp_path):
    # each waits for the other's file: they pass only when they run together
    _, _, got = run_probe(system_torch_python, tmp_path, "site.meet_a,site.meet_b", "--jobs", "2")
    assert got["site.meet_a"]["details"] == {"met": True} and got["site.meet_b"]["details"] == {"met": True}
    _, _, one_by_one = run_probe(system_torch_python, tmp_path, "site.meet_a,site.meet_b", isolation="spawn")
    assert one_by_one["site.meet_a"]["details"] == {"met": False}


def test_when_the_server_stops_the_probe_runs_the_rest_itself(system_torch_python, tmp_path):
    proc, report, got = run_probe(system_torch_python, tmp_path,
                                  "env.fingerprint,site.stop_the_server,security.cve_2025_2953", "--jobs", "1")
    assert "probe: the worker server stopped; the remaining checks run one by one" in proc.stderr
    # run again from the probe itself (a fresh interpreter), every result is there
    assert got["site.stop_the_server"]["status"] == "pass"
    assert got["site.stop_the_server"]["details"] == {"parent_was_server": False}
    assert got["security.cve_2025_2953"]["message"] == "killed by SIGFPE (exit -8)"
    assert got["env.fingerprint"]["status"] == "pass" and len(report["checks"]) == 3


def test_trace_gives_the_timeline_of_every_worker_check_longest_groups_first(system_torch_python, tmp_path,
                                                                            monkeypatch):
    trace = tmp_path / "trace.json"
    monkeypatch.setenv("PATCHER_PROBE_TRACE", str(trace))
    _proc, _report, by_id = run_probe(system_torch_python, tmp_path,
                                      "env.fingerprint,security,site.after_crash,site.after_hang")
    timeline = json.loads(trace.read_text())
    events = timeline["events"]
    whats = [e["what"] for e in events]
    assert whats[0] == "torch imported" and whats[-1] == "closed" and timeline["jobs"] >= 2
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    submitted = [e["checks"] for e in events if e["what"] == "submit"]
    assert [len(g) for g in submitted] == sorted((len(g) for g in submitted), reverse=True)
    # the two modules of two checks each (site's, security's unisolated pair) before the single ones
    assert sorted(submitted[:2]) == [["security.cve_2022_45907", "security.cve_2022_45907_bypass"],
                                     ["site.after_crash", "site.after_hang"]]
    assert all(len(group) == 1 for group in submitted[2:])
    away = [check for group in submitted for check in group]
    started = [e["id"] for e in events if e["what"] == "start"]
    assert sorted(started) == sorted(away) and set(away) <= set(by_id)
    assert not set(away) & {e["id"] for e in events if e["what"] == "here"}  # run here or in a worker, never both
    assert "env.fingerprint" in {e["id"] for e in events if e["what"] == "here"}


def test_without_the_variable_no_trace_is_written(system_torch_python, tmp_path):
    run_probe(system_torch_python, tmp_path, "env.fingerprint,security.cve_2025_32434")
    assert not list(tmp_path.glob("*.json"))


def test_a_trace_that_cannot_be_written_is_one_line_and_the_report_stands(system_torch_python, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PATCHER_PROBE_TRACE", str(tmp_path / "no-such-dir" / "trace.json"))
    proc, report, by_id = run_probe(system_torch_python, tmp_path, "env.fingerprint,security.cve_2025_32434")
    lines = [line for line in proc.stderr.splitlines() if "trace" in line]
    assert len(lines) == 1 and lines[0].startswith("probe: cannot write the trace: ")
    assert "Traceback" not in proc.stderr and set(by_id) == {"env.fingerprint", "security.cve_2025_32434"}
    assert not (tmp_path / "no-such-dir").exists()
