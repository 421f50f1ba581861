"""Checks in worker processes: one server imports torch once and forks a worker per group.

Why: an isolated check must run in a process of its own (a crash there must lose no other
check's result), and a fresh interpreter per check pays for ``import torch`` (and CUDA's
start) every time, seconds each.  So the probe starts one server process early (``python -m
<probe> --fork-server``, beside the probe's own ``import torch``), which imports torch and
the check modules and then waits; it never touches CUDA, so a process forked from it can.
Per request it forks a worker that runs a group of checks and reports each check's start
and result over a pipe:

* each isolated check is a group of its own (its worker is its crash boundary, as the fresh
  interpreter was; the server kills it at the check's time limit);
* the other checks run grouped by module, a worker per module, in declaration order within
  it; the first module of the run stays in the probe's own process.  If a worker dies, the
  check that was running is reported as killed (or timed out: the server kills a worker
  whose check overruns its limit by GRACE seconds, for a hang in C code that the in-process
  alarm cannot break), and the rest of its group goes to a new worker.

Up to ``jobs`` workers run at once (``--jobs``; default: the CPU count, at least 2, at most
8).  The report is the same as without workers (same entries, registry order); only the
wall time differs.  ``PATCHER_PROBE_ISOLATION=spawn`` turns the server off: every check but
the isolated ones runs in the probe's process, and each isolated one in a fresh interpreter,
one after the other.  That is also the fallback wherever the server cannot start or stops.

Standard library only, Python 3.6 syntax (the probe's rule).
"""

import collections
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

from . import framework

ISOLATION_ENV = "PATCHER_PROBE_ISOLATION"   # "spawn": no server (the way before it)
# At most this many checks of one module per worker (0: a module's checks share one worker):
# a long module, such as the determinism checks on a GPU, is the run's critical path.
GROUP_SIZE_ENV = "PATCHER_PROBE_GROUP_SIZE"
# A file to write the run's timeline into (JSON: seconds since the server started, per event):
# where the probe's wall time goes, measured, not guessed.
TRACE_ENV = "PATCHER_PROBE_TRACE"
GRACE = 10.0        # seconds past an in-process time limit before the server kills the worker
POLL = 0.02         # the server's loop period (child reaping, time limits)
STDERR_TAIL = 4000  # bytes of a worker's stderr kept for the report of its death


def default_jobs():
    return max(2, min(8, os.cpu_count() or 2))


def fork_available():
    return hasattr(os, "fork") and os.environ.get(ISOLATION_ENV, "fork") != "spawn"


def plan(specs, ctx):
    """(ids the probe's own process runs, groups of specs for workers), in registry order.

    Checks that do not apply here stay in the probe's process (they are skipped at once)."""
    applicable = [s for s in specs if framework.applicability(s, ctx.for_check(s)) is None]
    plain = [s for s in applicable if not s.isolate]
    home = plain[0].module if plain else None
    groups, by_module = [], {}
    for spec in applicable:
        if spec.isolate:
            groups.append([spec])
        elif spec.module != home:
            if spec.module not in by_module:
                by_module[spec.module] = []
                groups.append(by_module[spec.module])
            by_module[spec.module].append(spec)
    groups = split_groups(groups, group_size())
    # the longest groups first: the server forks in request order, at most ``jobs`` at a time
    groups.sort(key=lambda group: -len(group))
    away = set(s.id for group in groups for s in group)
    return set(s.id for s in specs if s.id not in away), groups


def group_size():
    try:
        return max(0, int(os.environ.get(GROUP_SIZE_ENV, "0")))
    except ValueError:
        return 0


def split_groups(groups, size):
    """Each group cut into consecutive runs of at most ``size`` checks (order kept)."""
    if size <= 0:
        return groups
    out = []
    for group in groups:
        out.extend(group[i:i + size] for i in range(0, len(group), size))
    return out


def wants_workers(specs):
    """Before torch is imported: could this selection use workers at all?"""
    return any(s.isolate for s in specs) or len(set(s.module for s in specs)) > 1


# --- the probe's side ---------------------------------------------------------------------------
class Server(object):
    """The probe's handle on the server: submit groups, then take each check's entry."""

    def __init__(self, jobs):
        self.jobs = jobs
        root, package = framework.package_root_and_name()
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # Nothing on disk: a probe killed from outside leaves nothing behind (the server sees
        # its parent go and ends its workers); the server's own errors come as protocol events.
        self.proc = subprocess.Popen([sys.executable, "-m", package, "--fork-server", "--jobs", str(jobs)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, name="probe-workers")
        self.reader.daemon = True
        self.reader.start()
        self.alive = True
        self.groups = {}
        self.entries = {}
        self.pending = set()
        self.ctx = None
        self.started = None
        self.budget = None
        self.fatal = None
        self.t0 = time.time()
        self.trace = [] if os.environ.get(TRACE_ENV) else None

    def mark(self, what, **fields):
        """One timeline entry (only with PATCHER_PROBE_TRACE)."""
        if self.trace is not None:
            fields.update(t=round(time.time() - self.t0, 4), what=what)
            self.trace.append(fields)

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            try:
                self.events.put(json.loads(line.decode("utf-8")))
            except ValueError:
                continue
        self.events.put(None)

    def begin(self, ctx, started, budget):
        self.ctx, self.started, self.budget = ctx, started, budget

    def submit(self, specs):
        gid = len(self.groups)
        group = {"ids": [s.id for s in specs], "done": set(), "running": None, "running_since": None}
        self.groups[gid] = group
        self.pending.update(group["ids"])
        self.mark("submit", group=gid, checks=group["ids"])
        request = {"group": gid, "checks": group["ids"], "patched_ids": sorted(self.ctx.patched_ids),
                   "has_cuda": bool(self.ctx.has_cuda), "started": self.started, "budget": self.budget}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._lost()

    def entry(self, spec):
        """The check's report entry once its worker has it; None when the server cannot give
        it (never submitted, or the server stopped): the caller then runs the check itself."""
        while spec.id not in self.entries:
            if not self.alive or spec.id not in self.pending:
                return None
            event = self.events.get()
            if event is None:
                self._lost()
                return None
            self._handle(event)
        self.pending.discard(spec.id)
        return self.entries.pop(spec.id)

    def _handle(self, event):
        if event.get("event") == "fatal":
            self.fatal = str(event.get("message", ""))
            return
        group = self.groups.get(event.get("group"))
        if group is None:
            return
        kind = event.get("event")
        self.mark(kind, group=event.get("group"), id=event.get("id"))
        if kind == "start":
            group["running"], group["running_since"] = event["id"], time.time()
        elif kind == "done":
            self.entries[event["id"]] = event["entry"]
            group["done"].add(event["id"])
            group["running"] = None
        elif kind == "refuse":
            for check_id in event.get("ids", ()):
                self.pending.discard(check_id)
                group["done"].add(check_id)
        elif kind == "exit":
            self._exited(group, event)

    def _exited(self, group, event):
        """A worker ended: blame the check it was running, hand the rest to a new worker."""
        remaining = [i for i in group["ids"] if i not in group["done"]]
        if not remaining:
            return
        blamed = group["running"] if group["running"] in remaining else remaining[0]
        spec = framework.get(blamed)
        limit = spec.timeout
        seconds = time.time() - group["running_since"] if group["running"] == blamed else 0.0
        outcome = framework.child_outcome(event.get("returncode"), bool(event.get("timed_out")),
                                          str(event.get("stderr", "")), limit, None)
        self.entries[blamed] = framework.record_outcome(framework.new_entry(spec, self.ctx), outcome, seconds)
        rest = [framework.get(i) for i in remaining if i != blamed]
        if rest:
            self.submit(rest)

    def _lost(self):
        if self.alive:
            self.alive = False
            sys.stderr.write("probe: the worker server stopped%s; the remaining checks run one by one\n"
                             % (": " + framework.one_line(self.fatal, 200) if self.fatal else ""))
            sys.stderr.flush()

    def close(self):
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.proc.stdout.close()
        if self.trace is not None:
            self.mark("closed")
            try:
                with open(os.environ[TRACE_ENV], "w") as fh:
                    json.dump({"jobs": self.jobs, "events": self.trace}, fh, indent=1)
            except OSError as exc:
                sys.stderr.write("probe: cannot write the trace: %s\n" % exc)


def start_server(only=None, jobs=None):
    """Start the server before the probe imports torch (the two imports overlap), when the
    selected checks could use workers; None when it cannot or need not be used."""
    if not fork_available():
        return None
    from . import load_checks
    from .report import select

    load_checks()
    if not wants_workers(select(framework.registry(), only)):
        return None
    try:
        return Server(jobs or default_jobs())
    except OSError as exc:
        sys.stderr.write("probe: cannot start the worker server (%s); checks run one by one\n" % exc)
        return None


# --- the server's side ----------------------------------------------------------------------------
class _Worker(object):
    def __init__(self, pid, fd, err_fd, request):
        self.pid = pid
        self.fd = fd            # its events
        self.err_fd = err_fd    # its stderr, of which the last STDERR_TAIL bytes are kept
        self.request = request
        self.buffer = b""
        self.stderr = b""
        self.deadline = None
        self.timed_out = False


def serve(torch, jobs):
    """The server's loop: read requests on stdin, fork workers, report on stdout."""
    protocol = os.fdopen(os.dup(1), "wb", 0)
    os.dup2(2, 1)  # a stray print (in torch, in a check) cannot reach the protocol
    parent = os.getppid()
    requests = collections.deque()
    workers = {}
    stdin_open, pending = True, b""

    def send(message):
        try:
            protocol.write((json.dumps(message) + "\n").encode("utf-8"))
        except OSError:  # the probe is gone; the loop notices and ends
            pass

    def forward(worker, data):
        worker.buffer += data
        while b"\n" in worker.buffer:
            line, worker.buffer = worker.buffer.split(b"\n", 1)
            try:
                event = json.loads(line.decode("utf-8"))
            except ValueError:
                continue
            event["group"] = worker.request["group"]
            if event.get("event") == "start":
                worker.deadline = time.time() + float(event["limit"]) if event.get("limit") else None
            elif event.get("event") == "done":
                worker.deadline = None
            send(event)

    def drain(worker, fd):
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                return
            if fd == worker.fd:
                forward(worker, data)
            else:
                worker.stderr = (worker.stderr + data)[-STDERR_TAIL:]

    while stdin_open or requests or workers:
        while requests and len(workers) < jobs:
            worker = _fork_worker(torch, requests.popleft(), protocol, workers)
            workers[worker.pid] = worker
        fds = ([0] if stdin_open else []) + [fd for w in workers.values() for fd in (w.fd, w.err_fd)]
        try:
            ready = select.select(fds, [], [], POLL if workers or requests else 0.5)[0] if fds else []
        except InterruptedError:
            ready = []
        for fd in ready:
            if fd == 0:
                data = os.read(0, 65536)
                if not data:
                    stdin_open = False
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        requests.append(json.loads(line.decode("utf-8")))
                continue
            for worker in workers.values():
                if fd in (worker.fd, worker.err_fd):
                    drain(worker, fd)
        now = time.time()
        for pid in list(workers):
            worker = workers[pid]
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                for fd in (worker.fd, worker.err_fd):
                    drain(worker, fd)
                    os.close(fd)
                del workers[pid]
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                send({"group": worker.request["group"], "event": "exit", "returncode": code,
                      "timed_out": worker.timed_out, "stderr": worker.stderr.decode("utf-8", "replace")})
            elif worker.deadline is not None and now > worker.deadline and not worker.timed_out:
                worker.timed_out = True
                _kill(pid)
        if os.getppid() != parent:  # the probe is gone: so are its workers
            for pid in workers:
                _kill(pid)
            return 1
    return 0


def fatal(message):
    """The server cannot serve (e.g. torch does not import): say so on the protocol."""
    sys.stdout.write(json.dumps({"event": "fatal", "message": message}) + "\n")
    sys.stdout.flush()


def _kill(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _fork_worker(torch, request, protocol, workers):
    read_fd, write_fd = os.pipe()
    err_read, err_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(read_fd)
            os.close(err_read)
            protocol.close()
            for other in workers.values():
                os.close(other.fd)
                os.close(other.err_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.dup2(err_write, 2)
            os.close(devnull)
            os.close(err_write)
            code = _run_group(torch, request, write_fd)
        except BaseException:
            try:
                traceback.print_exc()
                sys.stderr.flush()
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(write_fd)
    os.close(err_write)
    for fd in (read_fd, err_read):
        os.set_blocking(fd, False)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    return _Worker(pid, read_fd, err_read, request)


def _cuda_unusable_after_fork(torch):
    try:
        return bool(torch.cuda._is_in_bad_fork())
    except Exception:  # a torch without the function: it predates the check, trust the fork
        return False


def _run_group(torch, request, fd):
    """In the worker: run the group's checks one after the other, reporting each."""
    try:
        os.setpgid(0, 0)  # the server kills the worker and whatever it started
    except OSError:
        pass

    def send(message):
        data = (json.dumps(message) + "\n").encode("utf-8")
        while data:
            data = data[os.write(fd, data):]

    ctx = framework.Context(torch, request["patched_ids"], has_cuda=request["has_cuda"])
    if ctx.has_cuda and _cuda_unusable_after_fork(torch):
        # some torch touched CUDA while importing: a forked process cannot use it, so the
        # probe runs these checks itself, the way without workers
        send({"event": "refuse", "ids": request["checks"]})
        return 0
    started, budget = request["started"], request["budget"]
    for check_id in request["checks"]:
        spec = framework.get(check_id)
        limit = spec.timeout if spec.isolate else spec.timeout + GRACE
        send({"event": "start", "id": check_id, "limit": limit})
        remaining = None if budget is None else budget - (time.time() - started)
        entry = framework.run_spec(spec, ctx, remaining, in_process=True)
        sys.stdout.flush()
        sys.stderr.flush()
        send({"event": "done", "id": check_id, "entry": entry})
    return 0
