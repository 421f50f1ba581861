"""The in-target half of patcher.upstream_tests: install the pinned test dependencies, run
upstream's own tests with pytest, write one JSON result.

It runs inside the target environment with the target's interpreter, so it follows the
probe's rule: standard library only, Python 3.6 syntax, no import of torch or of patcher.
The tests themselves run in child processes under the wheelhouse's pytest (upstream's test
files are pytest/unittest programs that need pytest, expecttest and hypothesis); this file is
also the pytest plugin (``-p upstream_runner``) that records every test's outcome as it
happens, so a test that kills the interpreter (a crash is what some CVE tests provoke) is still
reported, as ``crashed``.

    python upstream_runner.py MANIFEST RESULT

MANIFEST (written by the host; paths relative to its directory):
    {"schema": 1, "tests_dir": "tree/test", "rootdir": "tree", "site_dir": "site",
     "wheel_dir": "wheels", "wheels": {"3.6": [{"file", "sha256", "unless_importable"?}], ...},
     "jobs": N or null, "selections": [{"id", "args": [...], "timeout_s", "heavy"}]}
    Selections run in up to ``jobs`` pytest processes at once (null: one per CPU the runner may
    use, at most MAX_AUTO_JOBS), heavy ones first; each is its own process and crash boundary,
    and the result lists them in the manifest's order whatever order they finished in.
RESULT: {"schema": 1, "error", "python", "python_version", "executable", "torch", "jobs",
         "installed", "target_provided": [{"file", "module", "origin"}],
         "selections": [{"id", "args", "returncode", "duration_s", "collected",
         "nodes": [{"node", "outcome", "duration_s", "message"}], "output_tail", "error"}]}
"""

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

SCHEMA = 1
EVENTS_VAR = "PATCHER_UPSTREAM_EVENTS"
OUTPUT_TAIL = 6000
MAX_AUTO_JOBS = 4  # each pytest process holds its own torch; more rarely pays on a probe host


# --- the pytest plugin (loaded in the child pytest with -p upstream_runner) -------------------
def _emit(entry):
    path = os.environ.get(EVENTS_VAR)
    if not path:
        return
    with open(path, "a") as out:
        out.write(json.dumps(entry) + "\n")
        out.flush()


def _short(report):
    longrepr = getattr(report, "longrepr", None)
    crash = getattr(longrepr, "reprcrash", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        text = str(longrepr[2])
    elif crash is not None and getattr(crash, "message", None):
        text = crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    else:
        text = getattr(report, "longreprtext", "") or str(longrepr or "")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    message = lines[-1] if lines else ""
    if message.startswith("Skipped: "):
        message = message[len("Skipped: "):]
    return message[:400]


def pytest_collection_finish(session):
    _emit({"event": "collected", "count": len(session.items)})


def pytest_collectreport(report):
    if report.outcome == "failed":
        _emit({"event": "collect_error", "node": report.nodeid, "message": _short(report)})


def pytest_runtest_logstart(nodeid, location):
    _emit({"event": "start", "node": nodeid})


def pytest_runtest_logreport(report):
    entry = {"event": "report", "node": report.nodeid, "when": report.when, "outcome": report.outcome,
             "duration_s": round(report.duration, 4)}
    if hasattr(report, "wasxfail"):
        entry["xfail"] = True
    if report.outcome != "passed" or hasattr(report, "wasxfail"):
        entry["message"] = _short(report)
    _emit(entry)


# --- installing the wheelhouse ----------------------------------------------------------------
def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def target_has(module):
    """Where the target's own copy of a top-level module is, or None (the payload is not on sys.path here)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin else None


def install(wheels, wheel_dir, site_dir):
    """Check each wheel's sha256, then unpack it into site_dir (wheels without a .data directory).

    A wheel marked ``unless_importable`` is left out where the target has that module itself
    (numpy: the target's torch was built against its own).  Returns (installed, kept), kept
    listing each left-out wheel with the target's module."""
    if os.path.isdir(site_dir):
        shutil.rmtree(site_dir)
    os.makedirs(site_dir)
    installed, kept, unpack = [], [], []
    for wheel in wheels:
        module = wheel.get("unless_importable")
        origin = target_has(module) if module else None
        if origin:
            kept.append({"file": wheel["file"], "module": module, "origin": origin})
        else:
            unpack.append(wheel)
    wheels = unpack
    for wheel in wheels:  # every hash first: nothing is unpacked from a set that does not match
        path = os.path.join(wheel_dir, wheel["file"])
        if not os.path.isfile(path):
            raise RuntimeError("test dependency {} is missing from the payload".format(wheel["file"]))
        got = _sha256(path)
        if got != wheel["sha256"]:
            raise RuntimeError("test dependency {} has sha256 {}, pinned {}".format(
                wheel["file"], got, wheel["sha256"]))
        installed.append({"file": wheel["file"], "sha256": got})
    for wheel in wheels:
        path = os.path.join(wheel_dir, wheel["file"])
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                parts = name.split("/")
                if name.startswith("/") or "\\" in name or ".." in parts or parts[0].endswith(".data"):
                    raise RuntimeError("test dependency {} holds {!r}: not a wheel the runner can unpack".format(
                        wheel["file"], name))
            archive.extractall(site_dir)
    return installed, kept


# --- running the selections -------------------------------------------------------------------
def _torch_info(env, cwd):
    code = ("import json, torch\n"
            "print(json.dumps({'version': torch.__version__, 'file': torch.__file__,"
            " 'cuda': bool(getattr(torch, 'cuda', None) and torch.cuda.is_available())}))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        raise RuntimeError("the target cannot import torch: %s" % (lines[-1] if lines else proc.returncode))
    return json.loads(out.strip().splitlines()[-1])


def _read_events(path):
    events = []
    if os.path.isfile(path):
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a crash
    return events


def _nodes(events, returncode, timed_out):
    """One entry per test node, in the order pytest ran them."""
    order = []
    state = {}
    for event in events:
        kind = event.get("event")
        if kind == "collect_error":
            node = event["node"] or "(collection)"
            order.append(node)
            state[node] = {"node": node, "outcome": "error", "duration_s": 0.0,
                           "message": "collection failed: " + event.get("message", "")}
        elif kind == "start":
            node = event["node"]
            if node not in state:
                order.append(node)
            state[node] = {"node": node, "outcome": None, "duration_s": 0.0, "message": ""}
        elif kind == "report":
            entry = state.setdefault(event["node"], {"node": event["node"], "outcome": None,
                                                     "duration_s": 0.0, "message": ""})
            if event["node"] not in order:
                order.append(event["node"])
            entry["duration_s"] = round(entry["duration_s"] + event.get("duration_s", 0.0), 4)
            outcome, when = event["outcome"], event["when"]
            if event.get("xfail"):
                outcome = "xfailed" if outcome == "skipped" else "xpassed"
            if when == "call":
                entry["outcome"] = outcome
            elif outcome == "failed":  # in setup or teardown
                outcome = entry["outcome"] = "error"
            elif outcome != "passed":  # skipped (or xfailed) in setup
                entry["outcome"] = outcome
            if event.get("message") and outcome != "passed":
                entry["message"] = event["message"]
    out = []
    for node in order:
        entry = state[node]
        if entry["outcome"] is None:  # started, never finished: the interpreter died or was stopped
            if timed_out:
                entry["outcome"], entry["message"] = "timeout", "the selection ran past its time limit"
            else:
                entry["outcome"] = "crashed"
                entry["message"] = (f"killed by signal {-returncode}" if returncode < 0
                                    else f"the test process ended (exit {returncode}) during this test")
        out.append(entry)
    return out


def run_selection(selection, tests_dir, rootdir, env, work):
    events = os.path.join(work, "events-{}.jsonl".format(selection["id"]))
    if os.path.exists(events):
        os.remove(events)
    child_env = dict(env)
    child_env[EVENTS_VAR] = events
    command = [sys.executable, "-m", "pytest", "-p", "upstream_runner", "-p", "no:cacheprovider",
               "--rootdir", rootdir, "-c", os.path.join(rootdir, "pytest.ini"),
               "-o", "console_output_style=classic", "--color=no", "-q"] + list(selection["args"])
    started = time.time()
    proc = subprocess.Popen(command, cwd=tests_dir, env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=selection.get("timeout_s"))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    duration = time.time() - started
    events_list = _read_events(events)
    collected = [e["count"] for e in events_list if e.get("event") == "collected"]
    nodes = _nodes(events_list, proc.returncode, timed_out)
    error = None
    if timed_out:
        error = "timed out after {} s".format(selection.get("timeout_s"))
    elif proc.returncode == 5:
        error = "selects no test in this tree"
    elif proc.returncode in (2, 3, 4) and not nodes:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        error = "pytest could not run it (exit {}): {}".format(proc.returncode, lines[-1] if lines else "")
    elif proc.returncode < 0 and not any(n["outcome"] == "crashed" for n in nodes):
        error = f"the test process was killed by signal {-proc.returncode}"
    return {"id": selection["id"], "args": list(selection["args"]), "returncode": proc.returncode,
            "duration_s": round(duration, 3), "collected": collected[-1] if collected else None,
            "nodes": nodes, "output_tail": output[-OUTPUT_TAIL:], "error": error}


def default_jobs():
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_JOBS, cpus))


def run_selections(selections, tests_dir, rootdir, env, work, jobs):
    """Every selection's result, in the order given; heavy selections start first so that the
    longest ones do not end up alone at the tail."""
    if jobs <= 1 or len(selections) <= 1:
        return [run_selection(s, tests_dir, rootdir, env, work) for s in selections]
    order = sorted(range(len(selections)), key=lambda i: not selections[i].get("heavy", False))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {i: pool.submit(run_selection, selections[i], tests_dir, rootdir, env, work) for i in order}
        return [futures[i].result() for i in range(len(selections))]


def main(argv):
    manifest_path, result_path = argv[1], argv[2]
    base = os.path.dirname(os.path.abspath(manifest_path))
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    version = "{}.{}".format(*sys.version_info[:2])
    result = {"schema": SCHEMA, "error": None, "python": sys.version.split()[0], "python_version": version,
              "executable": sys.executable, "torch": None, "installed": [], "target_provided": [],
              "selections": []}
    started = time.time()
    try:
        wheels = manifest["wheels"].get(version)
        if wheels is None:
            raise RuntimeError("no pinned test dependencies for Python {} (pinned for {})".format(
                version, ", ".join(sorted(manifest["wheels"]))))
        site_dir = os.path.join(base, manifest["site_dir"])
        result["installed"], result["target_provided"] = install(wheels, os.path.join(base, manifest["wheel_dir"]),
                                                                 site_dir)
        tests_dir = os.path.join(base, manifest["tests_dir"])
        rootdir = os.path.join(base, manifest["rootdir"])
        env = dict(os.environ)
        here = os.path.dirname(os.path.abspath(__file__))
        inherited = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([site_dir, here] + inherited)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop(EVENTS_VAR, None)
        result["torch"] = _torch_info(env, tests_dir)
        jobs = manifest.get("jobs") or default_jobs()
        result["jobs"] = jobs
        result["selections"] = run_selections(manifest["selections"], tests_dir, rootdir, env, base, jobs)
    except RuntimeError as exc:
        result["error"] = str(exc)
    result["duration_s"] = round(time.time() - started, 3)
    tmp = result_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    os.rename(tmp, result_path)
    return 0 if result["error"] is None else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
