"""The probe's check registry and the rules for running one check.

Runs inside the target environment: standard library and torch only, Python 3.6 syntax
(no dataclasses, no walrus, no ``from __future__ import annotations``).

A check module registers functions with ``@check(...)``; a function takes a ``Context``
and returns a dict of details (or None) for a pass, or raises ``Skip``, ``Fail`` or
``Finding``.  Nothing here imports torch: the registry is readable on a host without it
(``patcher.probe.all_check_ids()``).
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

DEVICES = ("cpu", "cuda", "any")
STATUSES = ("pass", "fail", "skip", "error")


class Skip(Exception):
    """The check does not apply here; the reason is recorded."""

    def __init__(self, reason):
        Exception.__init__(self, reason)
        self.reason = reason


class Fail(Exception):
    """The wheel does something wrong."""

    def __init__(self, message, details=None):
        Exception.__init__(self, message)
        self.message = message
        self.details = details


class Finding(Exception):
    """A known defect was observed; it fails the run only when the check is required."""

    def __init__(self, message, details=None):
        Exception.__init__(self, message)
        self.message = message
        self.details = details


class CheckTimeout(Exception):
    pass


class CheckSpec(object):
    """One registered check: what it proves and where it applies."""

    def __init__(self, check_id, fn, torch_range, device, patches, required, isolate, timeout):
        self.id = check_id
        self.fn = fn
        self.torch_range = torch_range
        self.torch_specifiers = parse_range(torch_range)
        self.device = device
        self.patches = tuple(patches)
        self.required = bool(required)
        self.isolate = bool(isolate)
        self.timeout = float(timeout)
        self.module = getattr(fn, "__module__", "")

    def describe(self):
        return {"id": self.id, "torch": self.torch_range, "device": self.device,
                "patches": list(self.patches), "required": self.required,
                "isolate": self.isolate, "timeout": self.timeout}


_REGISTRY = []  # CheckSpec, in registration order
_BY_ID = {}
_ID_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


def check(id, torch=">=1.4", device="cpu", patches=(), required=True, isolate=False, timeout=120):
    """Register ``fn(ctx)`` as the check ``id`` (e.g. ``maxpool2d.sweep``)."""
    if not _ID_RE.match(id):
        raise ValueError("bad check id %r: lowercase dotted words, e.g. 'env.fingerprint'" % (id,))
    if device not in DEVICES:
        raise ValueError("check %s: device must be one of %s" % (id, ", ".join(DEVICES)))
    if isinstance(patches, str):
        patches = (patches,)

    def register(fn):
        if id in _BY_ID:
            raise ValueError("check id %s registered twice (%s and %s)" % (id, _BY_ID[id].module, fn.__module__))
        spec = CheckSpec(id, fn, torch, device, patches, required, isolate, timeout)
        _REGISTRY.append(spec)
        _BY_ID[id] = spec
        return fn

    return register


def registry():
    """Checks in run order: by module in checks.MODULES, then declaration order. Sorted,
    not taken in import order, because a caller may import one check module early."""
    from .checks import MODULES

    def position(indexed):
        index, spec = indexed
        name = spec.fn.__module__.rsplit(".", 1)[-1]
        return (MODULES.index(name) if name in MODULES else len(MODULES), index)

    return [spec for _, spec in sorted(enumerate(_REGISTRY), key=position)]


def get(check_id):
    return _BY_ID[check_id]


# --- versions ------------------------------------------------------------------------------
_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")
_SPECIFIER_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


def parse_torch_version(text):
    """'1.13.0a0' -> (1, 13, 0); '2.11.0+cu130' -> (2, 11, 0); '1.4' -> (1, 4, 0)."""
    match = _VERSION_RE.match(str(text))
    if not match:
        raise ValueError("cannot read a version from %r" % (text,))
    return tuple(int(part or 0) for part in match.groups())


def parse_range(text):
    """'>=1.4,<2.0' -> [('>=', (1, 4, 0)), ('<', (2, 0, 0))]."""
    specifiers = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        match = _SPECIFIER_RE.match(part)
        if not match:
            raise ValueError("bad torch range %r (use e.g. '>=1.4' or '>=1.7,<2.0')" % (text,))
        numbers = tuple(int(n) for n in match.group(2).split("."))
        specifiers.append((match.group(1), numbers))
    return specifiers


def _pad(version, length):
    return tuple(version) + (0,) * (length - len(version))


def version_in_range(version, specifiers):
    for op, wanted in specifiers:
        if op in ("==", "!="):
            # '==1.13' matches every 1.13.x
            same = tuple(version[:len(wanted)]) == wanted
            ok = same if op == "==" else not same
        else:
            length = max(len(version), len(wanted))
            have, want = _pad(version, length), _pad(wanted, length)
            ok = {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want}[op]
        if not ok:
            return False
    return True


# --- the context a check sees ----------------------------------------------------------------
class ChildResult(object):
    def __init__(self, returncode, stdout, stderr, timed_out):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out

    @property
    def signal_name(self):
        """'SIGFPE' when the child died of a signal, else None."""
        if self.returncode is not None and self.returncode < 0:
            return signal_name(-self.returncode)
        return None


def signal_name(number):
    try:
        return signal.Signals(number).name
    except (ValueError, AttributeError):
        return "signal %d" % number


class Context(object):
    """What a check sees: ``.torch``, ``.torch_version``, ``.has_cuda``, ``.device``,
    ``.patched_ids`` and ``.log(msg)``."""

    def __init__(self, torch, patched_ids=(), device="cpu", has_cuda=None):
        self.torch = torch
        self.torch_version = parse_torch_version(torch.__version__)
        self.has_cuda = cuda_available(torch) if has_cuda is None else has_cuda
        self.device = device
        self.patched_ids = set(patched_ids)
        self.messages = []

    def for_check(self, spec):
        device = spec.device
        if device == "any":
            device = "cuda" if self.has_cuda else "cpu"
        return Context(self.torch, self.patched_ids, device, self.has_cuda)

    def log(self, msg):
        self.messages.append(str(msg))

    def run_python(self, code, timeout=60):
        """Run ``code`` in a child interpreter (this one), for checks that may crash it."""
        return run_child([sys.executable, "-c", code], timeout)


def cuda_available(torch):
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install must not stop the probe
        return False


def run_child(argv, timeout, env=None):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            universal_newlines=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return ChildResult(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return ChildResult(proc.returncode, out, err, True)


# --- running one check ------------------------------------------------------------------------
def effective_required(spec, patched_ids):
    """A check becomes required when the wheel carries a patch the check proves."""
    return spec.required or bool(set(spec.patches) & set(patched_ids))


def applicability(spec, ctx):
    """None when the check applies here, else the reason it is skipped."""
    if not version_in_range(ctx.torch_version, spec.torch_specifiers):
        return "needs torch %s; this is %s" % (spec.torch_range, ctx.torch.__version__)
    if spec.device == "cuda" and not ctx.has_cuda:
        if getattr(ctx.torch.version, "cuda", None) is None:
            return "needs CUDA; this torch is built without CUDA"
        return "needs CUDA; torch.cuda.is_available() is False (no GPU or driver)"
    return None


def one_line(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def jsonable(value):
    """Details must survive json.dumps; anything odd becomes its str()."""
    return json.loads(json.dumps(value, default=str))


def call_check(spec, ctx, timeout=None):
    """Run the check function here; return an outcome dict (never raises for check errors)."""
    outcome = {"outcome": "pass", "message": "", "details": None}
    try:
        with _alarm(timeout):
            result = spec.fn(ctx)
        if result is not None and not isinstance(result, dict):
            result = {"result": result}
        outcome["details"] = result
    except Skip as exc:
        outcome.update(outcome="skip", message=one_line(exc.reason))
    except Finding as exc:
        outcome.update(outcome="finding", message=one_line(exc.message), details=exc.details)
    except Fail as exc:
        outcome.update(outcome="fail", message=one_line(exc.message), details=exc.details)
    except CheckTimeout:
        outcome.update(outcome="fail", message="timed out after %g s" % timeout)
    except Exception as exc:
        tb = traceback.format_exc().strip().splitlines()
        outcome.update(outcome="error", message=one_line("%s: %s" % (type(exc).__name__, exc)),
                       details={"traceback": tb[-8:]})
    if ctx.messages:
        details = dict(outcome["details"] or {})
        details["log"] = list(ctx.messages)
        outcome["details"] = details
    try:
        outcome["details"] = jsonable(outcome["details"])
    except (TypeError, ValueError) as exc:
        outcome["details"] = {"unserialisable": str(exc)}
    return outcome


class _alarm(object):
    """Best-effort in-process time limit (a Python-level interrupt; C calls finish first).
    Checks that can hang inside C code use ``isolate=True`` for a hard limit."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.active = False

    def __enter__(self):
        usable = (self.seconds and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if usable:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.active = True
        return self

    @staticmethod
    def _fire(signum, frame):
        raise CheckTimeout()

    def __exit__(self, *exc_info):
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


def package_root_and_name():
    """Where the probe package lives, so a child interpreter can import it the same way
    (``patcher.probe`` in a checkout or a copied folder, or a top-level ``probe``)."""
    package = __name__.rsplit(".", 1)[0]
    here = os.path.dirname(os.path.abspath(__file__))
    root = here
    for _ in package.split("."):
        root = os.path.dirname(root)
    return root, package


def child_outcome(returncode, timed_out, stderr, timeout, outcome):
    """The outcome of a check that ran in a child process, from how the child ended and the
    outcome it wrote (None when it wrote none): a signal death or a kill at the time limit
    becomes a failure, an exit without a result an error."""
    if timed_out:
        return {"outcome": "fail", "message": "timed out after %g s (child process killed)" % timeout,
                "details": {"stderr": stderr[-2000:]}}
    if returncode is not None and returncode < 0:
        return {"outcome": "fail",
                "message": "killed by %s (exit %d)" % (signal_name(-returncode), returncode),
                "details": {"stderr": stderr[-2000:]}}
    if returncode != 0 or not outcome:
        return {"outcome": "error",
                "message": one_line("child process exited with %s and no result: %s"
                                    % (returncode, stderr.strip()[-300:])),
                "details": {"stderr": stderr[-2000:]}}
    return outcome


def call_isolated(spec, ctx, timeout):
    """Run the check in a fresh child interpreter; a signal death becomes a failure.

    (The probe's worker processes, ``workers.py``, do the same from one interpreter that
    imported torch once; this is the way without them: ``PATCHER_PROBE_ISOLATION=spawn``, or
    a fallback when they cannot be used.)"""
    root, package = package_root_and_name()
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    handle, result_path = tempfile.mkstemp(prefix="probe-child-", suffix=".json")
    os.close(handle)
    try:
        argv = [sys.executable, "-m", package, "--child", spec.id, "--child-result", result_path,
                "--patched-ids", ",".join(sorted(ctx.patched_ids))]
        child = run_child(argv, timeout, env=env)
        try:
            with open(result_path) as handle_:
                outcome = json.load(handle_)
        except (OSError, ValueError):
            outcome = None
        return child_outcome(child.returncode, child.timed_out, child.stderr, timeout, outcome)
    finally:
        try:
            os.unlink(result_path)
        except OSError:
            pass


def new_entry(spec, ctx):
    """A report entry for ``spec``, before it runs (status skip, no message)."""
    return {"id": spec.id, "status": "skip", "required": effective_required(spec, ctx.patched_ids),
            "message": "", "details": None, "patches": list(spec.patches), "duration_s": 0.0,
            "finding": False}


def record_outcome(entry, outcome, seconds):
    """Put an outcome dict (``call_check``'s or ``child_outcome``'s) into a report entry."""
    kind = outcome.get("outcome")
    entry["message"] = outcome.get("message") or ""
    entry["details"] = outcome.get("details")
    if kind == "finding":
        entry["status"] = "fail"
        entry["finding"] = True
    elif kind in ("pass", "fail", "skip", "error"):
        entry["status"] = kind
    else:
        entry["status"] = "error"
        entry["message"] = "unknown outcome %r" % (kind,)
    entry["duration_s"] = round(seconds, 4)
    return entry


def run_spec(spec, ctx, remaining_budget=None, in_process=False):
    """Gate, run and record one check: the entry of the report's ``checks`` list.

    ``in_process``: this process is already the check's own (a worker): an isolated check
    runs here too, its hard time limit kept by whoever started the process."""
    started = time.time()
    entry = new_entry(spec, ctx)
    check_ctx = ctx.for_check(spec)
    reason = applicability(spec, check_ctx)
    if reason is None and remaining_budget is not None and remaining_budget <= 0:
        reason = "the probe's time budget was spent before this check"
    if reason is not None:
        entry["message"] = reason
        return entry
    # the budget gates starting checks; one already running keeps its own time limit
    timeout = spec.timeout
    if spec.isolate and in_process:
        outcome = call_check(spec, check_ctx, None)
    elif spec.isolate:
        outcome = call_isolated(spec, check_ctx, timeout)
    else:
        outcome = call_check(spec, check_ctx, timeout)
    return record_outcome(entry, outcome, time.time() - started)
