"""Security checks: one per backported CVE fix (patches PT-0101 to PT-0111).

Each check feeds the vulnerable entry point a harmless trigger and passes when the input is
refused cleanly.  A stock torch that still has the defect fails the check; the checks are not
required on their own (a survey of a stock wheel reports them as failures without failing the
run) and become required when the wheel carries the patch that each one proves.

Triggers that can crash the interpreter (SIGFPE, out-of-bounds reads in the mobile
interpreter) run with ``isolate=True``: the framework runs them in a child process and reports
the signal as a failure.  Before each trigger a control call (the same entry point with valid
input) must work, so that a torch which refuses everything cannot pass by accident.
"""

import importlib.util
import io
import os
import pickle
import shutil
import struct
import sys
import tempfile
import zipfile

from ..framework import Fail, Finding, Skip, check

# --- CVE-2022-45907: torch.jit.annotations.parse_type_line evaluates its input -----------------
# The marker names resolve to the check's own objects (through the resolution callback the check
# passes in, or briefly through builtins), so a torch that evaluates the type comment calls into
# the check and nothing else.
CALL_MARKER = "patcher_probe_call"
TARGET_MARKER = "patcher_probe_target"
RECORD_MARKER = "patcher_probe_record"


def _parse_type_line(ctx):
    try:
        import torch.jit.annotations as annotations
    except ImportError as exc:
        raise Skip("torch.jit.annotations cannot be imported: %s" % exc) from None
    parse = getattr(annotations, "parse_type_line", None)
    if parse is None:
        raise Skip("this torch has no torch.jit.annotations.parse_type_line")
    return parse


def _type_line_control(parse):
    """A plain type comment must still parse, else refusals below would prove nothing."""
    try:
        arg_types, return_type = parse("# type: (int, List[int]) -> Tensor", None, None)
    except Exception as exc:
        raise Fail("parse_type_line no longer parses a plain type comment: %s: %s"
                   % (type(exc).__name__, exc)) from None
    # the file that was probed: a patched copy can be loaded in place of the installed one
    module = sys.modules.get(parse.__module__)
    return {"control": "%s -> %s" % ([str(t) for t in arg_types], return_type),
            "module_file": getattr(module, "__file__", None)}


def _try_type_line(parse, type_line, rcb):
    """'refused: <error>' or 'accepted'; the caller reads its own marker for evaluation."""
    try:
        parse(type_line, rcb, None)
    except Exception as exc:
        return "refused: %s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    return "accepted"


@check("security.cve_2022_45907", torch=">=1.4", device="cpu", patches=("PT-0101",), required=False)
def cve_2022_45907(ctx):
    """A call in a type comment must be refused, not run."""
    parse = _parse_type_line(ctx)
    details = _type_line_control(parse)
    calls = []

    def recorder(*args):
        calls.append(args)
        return int

    def rcb(name):
        return recorder if name == CALL_MARKER else None

    type_line = "# type: (%s('evaluated')) -> int" % CALL_MARKER
    details["type_line"] = type_line
    details["result"] = _try_type_line(parse, type_line, rcb)
    if calls:
        raise Finding("parse_type_line ran a call written in a type comment (CVE-2022-45907)", details)
    return details


@check("security.cve_2022_45907_bypass", torch=">=1.4", device="cpu", patches=("PT-0101",),
       required=False)
def cve_2022_45907_bypass(ctx):
    """Type comments that reach Python code without a call must be refused too.

    Upstream's fix (#89189, in 1.13.1) refuses a type comment whose bytecode has an opcode
    named *CALL*.  Two shapes get past it:

    * the bypass published in pytorch#151233: a comprehension whose loop target plants a
      callable as a class's ``__eq__``, then ``==`` runs it.  It works where Python inlines
      comprehensions (3.12 and later); on older Pythons the comprehension is itself a call and
      is refused, so this shape alone cannot show the defect there;
    * the operator route the bypass relies on, which works on every Python: a comparison on an
      object handed back by the resolver runs that object's ``__eq__``.

    Both use objects of the check's own, so an affected torch calls only into the check.
    """
    parse = _parse_type_line(ctx)
    details = _type_line_control(parse)
    evaluated = []

    class Target(object):
        def __eq__(self, other):
            evaluated.append(("operator", other))
            return True

        __hash__ = object.__hash__

    class PlantedTarget(object):
        pass

    def record(*args):
        evaluated.append(("planted", args[-1] if args else None))
        return True

    def rcb(name):
        if name == TARGET_MARKER:
            return Target()
        return None

    # The comprehension shape resolves its names through builtins on every Python (a
    # comprehension body does not see the rcb on <= 3.11), so the markers go there briefly.
    import builtins
    planted = PlantedTarget()
    shapes = [
        ("pytorch#151233 comprehension",
         "# type: [%s == 'evaluated' for %s.__class__.__eq__ in [%s]] -> int"
         % (TARGET_MARKER, TARGET_MARKER, RECORD_MARKER), None),
        ("comparison on a resolved object", "# type: (%s == 1) -> int" % TARGET_MARKER, rcb),
    ]
    results = {}
    setattr(builtins, TARGET_MARKER, planted)
    setattr(builtins, RECORD_MARKER, record)
    try:
        for name, type_line, shape_rcb in shapes:
            before = len(evaluated)
            outcome = _try_type_line(parse, type_line, shape_rcb)
            if len(evaluated) > before:
                outcome = "evaluated (%s)" % outcome
            results[name] = {"type_line": type_line, "result": outcome}
    finally:
        for marker in (TARGET_MARKER, RECORD_MARKER):
            if hasattr(builtins, marker):
                delattr(builtins, marker)
        if "__eq__" in PlantedTarget.__dict__:
            del PlantedTarget.__eq__
    details["shapes"] = results
    details["python"] = "%d.%d.%d" % sys.version_info[:3]
    if evaluated:
        which = sorted(name for name, entry in results.items() if entry["result"].startswith("evaluated"))
        raise Finding("parse_type_line evaluated a type comment that reaches Python code without a "
                      "call: %s (pytorch#151233)" % ", ".join(which), details)
    return details


# --- CVE-2025-3730: ctc_loss with empty input ---------------------------------------------------
@check("security.cve_2025_3730", torch=">=1.4", device="any", patches=("PT-0102",), required=False,
       isolate=True, timeout=120)
def cve_2025_3730(ctx):
    """ctc_loss with an empty log_probs must raise (CUDA divided by a zero batch: SIGFPE)."""
    torch = ctx.torch
    functional = torch.nn.functional
    devices = ["cpu"] + (["cuda"] if ctx.has_cuda else [])
    details = {"devices": devices}
    for device in devices:
        # control: a valid batch must still give a finite loss
        log_probs = torch.randn(6, 2, 4, device=device).log_softmax(2)
        targets = torch.tensor([[1, 2], [1, 1]], dtype=torch.long, device=device)
        loss = functional.ctc_loss(log_probs, targets, torch.tensor([6, 6]), torch.tensor([2, 2]),
                                   reduction="none")
        if not bool(torch.isfinite(loss).all()):
            raise Fail("ctc_loss on %s gave a non-finite loss for a valid batch: %s" % (device, loss.tolist()))
        cases = {
            # the reproducer of pytorch#150835: no time steps and no batch
            "empty input, empty batch": ((0, 0, 4), 0),
            "empty batch": ((5, 0, 4), 0),
            "empty input": ((0, 2, 4), 2),
        }
        results = {}
        for name in sorted(cases):
            shape, batch = cases[name]
            empty = torch.randn(*shape, device=device).log_softmax(2)
            targets = torch.ones(batch, 1, dtype=torch.long, device=device)
            lengths = torch.full((batch,), shape[0], dtype=torch.long)
            target_lengths = torch.zeros(batch, dtype=torch.long)
            try:
                out = functional.ctc_loss(empty, targets, lengths, target_lengths, reduction="none")
                if device == "cuda":
                    torch.cuda.synchronize()
                results[name] = "returned shape %s" % (list(out.shape),)
            except RuntimeError as exc:
                results[name] = "refused: %s" % str(exc).splitlines()[0][:200]
        details[device] = results
    # Reaching this line means no case killed the process; the upstream fix (and ours) refuses
    # every empty log_probs, older CPU kernels raise or return an empty loss, both harmless.
    return details


# --- CVE-2025-2953: mkldnn max_pool2d with stride 0 ---------------------------------------------
@check("security.cve_2025_2953", torch=">=1.4", device="cpu", patches=("PT-0103",), required=False,
       isolate=True, timeout=60)
def cve_2025_2953(ctx):
    """torch.mkldnn_max_pool2d with stride 0 must raise (stock 1.4-2.7 divide by it: SIGFPE)."""
    torch = ctx.torch
    mkldnn = getattr(torch.backends, "mkldnn", None)
    if mkldnn is None:
        import torch.backends.mkldnn as mkldnn
    if not mkldnn.is_available():
        raise Skip("this torch is built without MKL-DNN (oneDNN): the affected kernel is absent")
    pool = getattr(torch, "mkldnn_max_pool2d", None)
    if pool is None:
        raise Skip("this torch has no torch.mkldnn_max_pool2d")
    x = torch.randn(1, 2, 8, 8).to_mkldnn()
    control = pool(x, [2, 2], [2, 2]).to_dense()
    if list(control.shape) != [1, 2, 4, 4]:
        raise Fail("mkldnn_max_pool2d with stride 2 gave shape %s, expected [1, 2, 4, 4]"
                   % list(control.shape))
    try:
        out = pool(x, [2, 2], [0, 0])
    except (RuntimeError, ValueError) as exc:
        return {"stride_0": "refused: %s" % str(exc).splitlines()[0][:200]}
    raise Finding("mkldnn_max_pool2d accepted stride 0 and returned shape %s"
                  % list(out.to_dense().shape), {"stride_0": "accepted"})


# --- CVE-2024-31580 / CVE-2024-31583: malformed mobile bytecode ---------------------------------
def _lite_interpreter_api(torch):
    """(save, load) for lite-interpreter models, or Skip where this torch has none."""
    try:
        import torch.jit.mobile as mobile
        load = mobile._load_for_lite_interpreter
    except (ImportError, AttributeError):
        raise Skip("this torch has no Python binding for the mobile (lite) interpreter "
                   "(torch.jit.mobile._load_for_lite_interpreter, torch >= 1.6)") from None

    def make_model():
        class PairOf(torch.nn.Module):
            def forward(self, x: int):
                return (x, x + 1)

        scripted = torch.jit.script(PairOf())
        saver = getattr(scripted, "_save_to_buffer_for_lite_interpreter", None)
        if saver is None:
            raise Skip("this torch cannot save a lite-interpreter model to a buffer")
        return saver()

    return make_model, load


def _rewrite_instructions(node, rewrite):
    """Apply ``rewrite`` to every instruction list ('instructions', ((op, X, N), ...))."""
    if isinstance(node, tuple):
        if len(node) == 2 and node[0] == "instructions" and isinstance(node[1], tuple):
            return ("instructions", tuple(rewrite(tuple(ins)) for ins in node[1]))
        return tuple(_rewrite_instructions(item, rewrite) for item in node)
    return node


def _with_bytecode(model_bytes, rewrite):
    """The model archive with each instruction passed through ``rewrite``."""
    source = zipfile.ZipFile(io.BytesIO(model_bytes))
    out = io.BytesIO()
    found = False
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("/bytecode.pkl"):
                data = pickle.dumps(_rewrite_instructions(pickle.loads(data), rewrite), protocol=2)
                found = True
            target.writestr(info.filename, data)
    if not found:
        raise Skip("this torch's lite-interpreter archive has no bytecode.pkl")
    return out.getvalue()


def _run_malformed_bytecode(ctx, opcode, operand, what):
    """Load and run the model with ``opcode``'s X operand set to ``operand``."""
    torch = ctx.torch
    make_model, load = _lite_interpreter_api(torch)
    model = make_model()

    def unchanged(ins):
        return ins

    try:
        control = load(io.BytesIO(_with_bytecode(model, unchanged)))(3)
    except Exception as exc:
        raise Skip("a re-packed lite-interpreter model does not load here (%s: %s); the "
                   "malformed-bytecode trigger cannot be built" % (type(exc).__name__, exc)) from None
    if tuple(control) != (3, 4):
        raise Fail("the control lite-interpreter model returned %r, expected (3, 4)" % (control,))

    seen = []

    def malformed(ins):
        if ins[0] == opcode:
            seen.append(ins)
            return (ins[0], operand) + tuple(ins[2:])
        return ins

    crafted = _with_bytecode(model, malformed)
    if not seen:
        raise Skip("this torch compiles the probe model without a %s instruction" % opcode)
    details = {"instruction": "%s X=%d (was %d)" % (opcode, operand, seen[0][1])}
    for stage in ("load", "run"):
        try:
            if stage == "load":
                module = load(io.BytesIO(crafted))
            else:
                result = module(3)
        except RuntimeError as exc:
            if "bad_function_call" in str(exc):
                # not a refusal: an empty operator slot read past the table was called (seen on
                # PyPI's torch 1.8.1, where the same trigger otherwise dies of SIGSEGV)
                details["result"] = "failed at %s: %s" % (stage, _first_line(exc))
                raise Finding("the mobile interpreter used the %s operand without checking it (%s)"
                              % (opcode, what), details) from None
            # a torch check (c10::Error) refused the bytecode: the clean outcome
            details["result"] = "refused at %s: %s" % (stage, _first_line(exc))
            return details
        except Exception as exc:
            # anything else came out of reading past the table (seen on torch 2.11.0: the
            # std::string built from a stray operator name fails, pybind11 maps it to ValueError)
            details["result"] = "failed at %s: %s: %s" % (stage, type(exc).__name__, _first_line(exc))
            raise Finding("the mobile interpreter used the %s operand without checking it (%s)"
                          % (opcode, what), details) from None
    details["result"] = "returned %r" % (result,)
    raise Finding("the mobile interpreter ran %s without checking its operand (%s)" % (opcode, what),
                  details)


def _first_line(exc):
    text = str(exc)
    return text.splitlines()[0][:200] if text else ""


@check("security.cve_2024_31580", torch=">=1.4", device="cpu", patches=("PT-0104",), required=False,
       isolate=True, timeout=120)
def cve_2024_31580(ctx):
    """TUPLE_CONSTRUCT claiming more inputs than the stack holds must be refused.

    Stock torch reads (and moves out of) memory below the interpreter stack: the child
    process usually dies of SIGSEGV or SIGBUS, which the framework reports as a failure.
    """
    return _run_malformed_bytecode(ctx, "TUPLE_CONSTRUCT", 64, "CVE-2024-31580")


@check("security.cve_2024_31583", torch=">=1.4", device="cpu", patches=("PT-0105",), required=False,
       isolate=True, timeout=120)
def cve_2024_31583(ctx):
    """An OP instruction naming an operator index past the function's table must be refused.

    Stock torch indexes its operator table with it (at load, where the upgrader scans the
    instructions, and when the instruction runs): the child usually dies of SIGSEGV.
    """
    return _run_malformed_bytecode(ctx, "OP", 7, "CVE-2024-31583")



# --- CVE-2025-32434: torch.load(weights_only=True) runs a TorchScript archive's code -------------
# The payload module is written to a temporary file and imported from there, so that TorchScript
# can read its source on every Python.  Its __setstate__ (run whenever the archive is loaded)
# writes the letter P into the marker file it names, through torch.from_file(shared=True).
PAYLOAD_SOURCE = """\
from typing import List

import torch


class Payload(torch.nn.Module):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    @torch.jit.export
    def __getstate__(self) -> List[str]:
        return [self.path]

    @torch.jit.export
    def __setstate__(self, state: List[str]) -> None:
        self.path = state[0]
        self.training = False
        written = torch.from_file(state[0], True, 8, dtype=torch.uint8)
        written.fill_(80)
        if int(written[0]) != 80:
            self.path = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
"""
MARKER_CLEAN = b"\0" * 8


def _torchscript_payload(torch, workdir, marker):
    path = os.path.join(workdir, "patcher_probe_payload.py")
    with open(path, "w") as fh:
        fh.write(PAYLOAD_SOURCE)
    spec = importlib.util.spec_from_file_location("patcher_probe_payload", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["patcher_probe_payload"] = module
    spec.loader.exec_module(module)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module.Payload(marker)), buf)
    return buf.getvalue()


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def _reset(path):
    with open(path, "wb") as fh:
        fh.write(MARKER_CLEAN)


def _weights_only_control(torch):
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf)
    buf.seek(0)
    try:
        back = torch.load(buf, weights_only=True)
    except Exception as exc:
        raise Fail("torch.load(weights_only=True) refused a plain state dict: %s: %s"
                   % (type(exc).__name__, _first_line(exc))) from None
    if back["w"].tolist() != [0.0, 1.0, 2.0, 3.0]:
        raise Fail("torch.load(weights_only=True) gave %r for a plain state dict" % (back,))


@check("security.cve_2025_32434", torch=">=1.13", device="cpu", patches=("PT-0106",), required=False,
       isolate=True, timeout=120)
def cve_2025_32434(ctx):
    """torch.load(weights_only=True) of a TorchScript archive must refuse it, not run its code."""
    torch = ctx.torch
    _weights_only_control(torch)
    workdir = tempfile.mkdtemp(prefix="patcher-probe-32434-")
    try:
        marker = os.path.join(workdir, "marker.bin")
        _reset(marker)
        archive = _torchscript_payload(torch, workdir, marker)
        # control: the archive is a working TorchScript archive whose code runs when it is loaded
        torch.jit.load(io.BytesIO(archive))
        if _read(marker) != b"P" * 8:
            raise Skip("this torch's TorchScript does not run the payload's __setstate__ through "
                       "torch.jit.load; the trigger cannot be built")
        _reset(marker)
        details = {"archive_bytes": len(archive), "module_file": _module_files(["torch.serialization"])}
        try:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = torch.load(io.BytesIO(archive), weights_only=True)
        except Exception as exc:
            details["result"] = "refused: %s: %s" % (type(exc).__name__, _first_line(exc))
            if _read(marker) != MARKER_CLEAN:
                raise Finding("torch.load(weights_only=True) refused the archive only after its code "
                              "wrote the marker file", details) from None
            return details
        details["result"] = "returned %s" % type(loaded).__name__
        if _read(marker) != MARKER_CLEAN:
            raise Finding("torch.load(weights_only=True) ran code from a TorchScript archive: it wrote "
                          "the probe's marker file (CVE-2025-32434)", details)
        raise Finding("torch.load(weights_only=True) loaded a TorchScript archive, whose code it runs "
                      "(CVE-2025-32434)", details)
    finally:
        sys.modules.pop("patcher_probe_payload", None)
        shutil.rmtree(workdir, ignore_errors=True)


# --- CVE-2026-24747: weights_only unpickler, SETITEM on tensors and storage sizes ---------------
def _pickle_str(text):
    data = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(data)) + data


def _pickle_int(value):
    return b"J" + struct.pack("<i", value)


def _tensor_pickle(numel, size, tail=b""):
    """A protocol 2 pickle of one float tensor over storage '0' declaring ``numel`` elements."""
    return b"".join([
        b"\x80\x02",
        b"ctorch._utils\n_rebuild_tensor_v2\n",
        b"(",                                             # args of _rebuild_tensor_v2
        b"(", _pickle_str("storage"), b"ctorch\nFloatStorage\n", _pickle_str("0"), _pickle_str("cpu"),
        _pickle_int(numel), b"t", b"Q",                   # persistent id -> the storage
        _pickle_int(0),                                   # storage offset
        b"(", _pickle_int(size), b"t",                    # size
        b"(", _pickle_int(1), b"t",                       # stride
        b"\x89",                                          # requires_grad False
        b"ccollections\nOrderedDict\n)R",                 # backward hooks: OrderedDict()
        b"t", b"R",
        tail, b"."])


def _checkpoint(data_pkl, record):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/data/0", record)
        archive.writestr("archive/version", "3\n")
    return out.getvalue()


def _load_weights_only(torch, data):
    try:
        return "loaded", torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        # torch prefixes the unpickler's own error with a long advice: keep the error itself
        text = " ".join(str(exc).split())
        text = text.split("WeightsUnpickler error: ")[-1]
        return "refused: %s: %s" % (type(exc).__name__, text[:240]), None


def _module_files(names):
    """The files the loader modules came from (a patched copy can be loaded in their place)."""
    return dict((n, getattr(sys.modules.get(n), "__file__", None)) for n in names)


@check("security.cve_2026_24747", torch=">=1.13", device="cpu", patches=("PT-0107",), required=False,
       isolate=True, timeout=120)
def cve_2026_24747(ctx):
    """The weights_only loader must refuse SETITEM on a tensor and a storage larger than its record."""
    torch = ctx.torch
    record = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    outcome, control = _load_weights_only(torch, _checkpoint(_tensor_pickle(4, 4), record))
    if control is None or control.tolist() != [1.0, 2.0, 3.0, 4.0]:
        raise Fail("a hand-made checkpoint of one tensor did not load with weights_only=True (%s)" % outcome)
    details = {"module_file": _module_files(["torch.serialization", "torch._weights_only_unpickler"])}
    found = []
    # 1. a storage declaring 65,536 floats over a record of 16 bytes
    outcome, big = _load_weights_only(torch, _checkpoint(_tensor_pickle(1 << 16, 1 << 16), record))
    details["oversized storage"] = outcome
    if big is not None:
        nbytes = big.storage().nbytes() if hasattr(big.storage(), "nbytes") else big.numel() * 4
        details["oversized storage"] = "loaded: a %d-byte storage over a %d-byte record" % (nbytes, len(record))
        found.append("a storage larger than its record")
    # 2. SETITEM applied to the tensor itself: element 0 set to 7.0
    outcome, written = _load_weights_only(
        torch, _checkpoint(_tensor_pickle(4, 4, tail=_pickle_int(0) + _pickle_int(7) + b"s"), record))
    details["SETITEM on a tensor"] = outcome
    if written is not None:
        details["SETITEM on a tensor"] = "loaded: element 0 is %r" % (float(written[0]),)
        found.append("SETITEM writing into a tensor")
    if found:
        raise Finding("the weights_only loader accepted %s (CVE-2026-24747)" % " and ".join(found), details)
    return details


# --- CVE-2025-2148: None where an operator takes a Future ----------------------------------------
@check("security.cve_2025_2148", torch=">=1.6", device="cpu", patches=("PT-0108",), required=False,
       isolate=True, timeout=60)
def cve_2025_2148(ctx):
    """An operator given None for a Future argument must raise (stock torch dereferences it)."""
    torch = ctx.torch
    try:
        op = torch.ops.profiler._call_end_callbacks_on_jit_fut
    except (AttributeError, RuntimeError):
        raise Skip("this torch has no profiler::_call_end_callbacks_on_jit_fut operator") from None
    futures = getattr(torch, "futures", None)
    if futures is None:
        raise Skip("this torch has no torch.futures")
    # control: a real Future goes through, and its value comes back once it completes
    enter = torch.ops.profiler._record_function_enter
    try:
        handle = enter("patcher_probe", None)
    except RuntimeError:
        # 1.8 declares _record_function_enter(str name), without the later optional args
        handle = enter("patcher_probe")
    fut = futures.Future()
    out = op(handle, fut)
    fut.set_result(5)
    if out.wait() != 5:
        raise Fail("_call_end_callbacks_on_jit_fut did not pass the future's value through")
    try:
        op(torch.tensor(0), None)
    except (RuntimeError, TypeError) as exc:
        return {"none_future": "refused: %s: %s" % (type(exc).__name__, _first_line(exc))}
    raise Finding("_call_end_callbacks_on_jit_fut accepted None for its Future argument",
                  {"none_future": "accepted"})


# --- CVE-2025-2998: pad_packed_sequence trusts a hand-made PackedSequence's batch sizes ----------
# Batch sizes that go up and down again end more sequences than the kernel's lengths array holds:
# the kernel writes below the array on the heap.  Written and proven for 1.4's kernel (PT-0110);
# the range widens once the check has been run on later releases.
PAD_PACKED_TRIGGER_REPEATS = 4096


@check("security.cve_2025_2998", torch=">=1.4,<1.5", device="cpu", patches=("PT-0110",), required=False,
       isolate=True, timeout=60)
def cve_2025_2998(ctx):
    """pad_packed_sequence of batch sizes that increase again must raise (stock 1.4 corrupts the heap)."""
    torch = ctx.torch
    rnn = torch.nn.utils.rnn
    # control: a packed batch made by pack_sequence pads back to its input
    seqs = [torch.arange(3.0), torch.arange(2.0), torch.arange(1.0)]
    padded, lengths = rnn.pad_packed_sequence(rnn.pack_sequence(seqs))
    if lengths.tolist() != [3, 2, 1] or padded[:, 0].tolist() != [0.0, 1.0, 2.0]:
        raise Fail("pad_packed_sequence no longer pads a packed batch back: lengths %r" % (lengths.tolist(),))
    batch_sizes = torch.tensor([2, 1] * PAD_PACKED_TRIGGER_REPEATS, dtype=torch.int64)
    data = torch.zeros(int(batch_sizes.sum()), 1)
    details = {"batch_sizes": "[2, 1] x %d over %d rows" % (PAD_PACKED_TRIGGER_REPEATS, data.size(0))}
    try:
        rnn.pad_packed_sequence(rnn.PackedSequence(data, batch_sizes))
    except (RuntimeError, ValueError) as exc:
        details["result"] = "refused: %s: %s" % (type(exc).__name__, _first_line(exc))
        return details
    details["result"] = "accepted"
    raise Finding("pad_packed_sequence accepted batch sizes that increase again (CVE-2025-2998): its kernel "
                  "wrote past its lengths array", details)


# --- CVE-2025-3001: an RNN cell splits gates of a shape it never checked ---------------------------
# A hidden state of more dimensions passes RNNCellBase's size(0)/size(1) checks; linear() broadcasts
# it and chunk() then returns fewer gate pieces than the cell indexes.  Written and proven for 1.4's
# cells (PT-0111); the range widens once the check has been run on later releases.
@check("security.cve_2025_3001", torch=">=1.4,<1.5", device="cpu", patches=("PT-0111",), required=False,
       isolate=True, timeout=60)
def cve_2025_3001(ctx):
    """LSTMCell given a 5-D hidden state must raise (stock 1.4 reads gate pieces that do not exist)."""
    torch = ctx.torch
    cell = torch.nn.LSTMCell(1, 1)
    # control: the same cell on (batch, hidden) states
    hy, cy = cell(torch.zeros(1, 1), (torch.zeros(1, 1), torch.zeros(1, 1)))
    if tuple(hy.shape) != (1, 1) or tuple(cy.shape) != (1, 1):
        raise Fail("LSTMCell no longer returns (batch, hidden) states: %r, %r" % (tuple(hy.shape), tuple(cy.shape)))
    details = {"hidden": "hx of shape (1, 1, 5, 127, 1), cx (1, 1), cell LSTMCell(1, 1)"}
    try:
        cell(torch.zeros(1, 1), (torch.zeros(1, 1, 5, 127, 1), torch.zeros(1, 1)))
    except (RuntimeError, ValueError, IndexError) as exc:
        details["result"] = "refused: %s: %s" % (type(exc).__name__, _first_line(exc))
        return details
    details["result"] = "accepted"
    raise Finding("LSTMCell accepted a hidden state of 5 dimensions (CVE-2025-3001)", details)


# --- CVE-2025-55553: FX writes the Python keyword `from` into the code it generates ------------
# Two routes to the same defect in FX's code generator (torch/fx/graph.py), which writes the
# target and the keyword arguments of each node as Python source:
# * make_fx (torch/fx/experimental/proxy_tensor.py, from 1.13) records x.random_(a, b) as
#   aten::random_.from, spelled torch.ops.aten.random_.from (the reported crash);
# * FX's own tracer, fx.symbolic_trace (torch.fx, from 1.8), records a keyword argument `from`
#   (Tensor.uniform_'s) as "from = ...".
# Either way the GraphModule's source does not compile: the trace dies with a SyntaxError.
MAKE_FX_ROUTE = "an operator overload named 'from' (aten::random_.from, make_fx)"
SYMBOLIC_TRACE_ROUTE = "a keyword argument named 'from' (fx.symbolic_trace)"


def _has_module(name):
    """Whether the module ``name`` exists here (without importing it; a missing parent package is absence)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _fx_trace(trace):
    """(graph module, None), or (None, 'SyntaxError ...') when the generated source does not compile."""
    try:
        return trace(), None
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        return None, "SyntaxError: %s%s" % (exc.msg, (": " + line[:200]) if line else "")


def _draws_within(out, low, high, integral):
    values = out.tolist()
    if not values:
        return False
    if integral:
        return all(low <= v < high and v == int(v) for v in values)
    return all(low <= v <= high for v in values)


def _draw_from_to(x):
    return x.clone().random_(3, 7)


def _uniform_from_keyword(x):
    return x.uniform_(**{"from": 2.0, "to": 3.0})


def _add_one(x):
    return x.clone().add_(1)


def _fx_control(name, trace, torch):
    """An ordinary in-place op must trace, compile and run under ``name`` first."""
    control = trace(_add_one)
    if control(torch.zeros(3)).tolist() != [1.0, 1.0, 1.0]:
        raise Fail("%s of x.clone().add_(1) did not give a working graph" % name)


def _fx_route(details, found, route, what, trace, draws_ok, compiled_text, wrong_draws):
    """Trace one route: a SyntaxError out of the trace is the defect found (``found`` gets the
    route); a graph that compiles must also draw within the range it was given."""
    gm, error = _fx_trace(trace)
    if error is not None:
        details[what] = error
        details["routes"][route] = "found"
        found.append(route)
        return
    if not draws_ok(gm):
        raise Fail(wrong_draws)
    details[what] = compiled_text
    details["routes"][route] = "not found"


@check("security.cve_2025_55553", torch=">=1.8", device="cpu", patches=("PT-0109",), required=False,
       isolate=True, timeout=120)
def cve_2025_55553(ctx):
    """Tracing x.random_(from, to) with make_fx (where torch.fx.experimental.proxy_tensor exists,
    1.13 on), and a call with a `from` keyword with fx.symbolic_trace (wherever torch.fx exists,
    1.8 on), must give code that compiles and runs (stock torch: a SyntaxError out of the trace)."""
    torch = ctx.torch
    if not _has_module("torch.fx"):
        raise Skip("this torch has no torch.fx")
    fx = importlib.import_module("torch.fx")
    make_fx = None
    if _has_module("torch.fx.experimental.proxy_tensor"):
        from torch.fx.experimental.proxy_tensor import make_fx
    # controls: an ordinary in-place op traces, compiles and runs under each tracer used below
    _fx_control("fx.symbolic_trace", fx.symbolic_trace, torch)
    if make_fx is not None:
        _fx_control("make_fx", lambda fn: make_fx(fn)(torch.zeros(4)), torch)
    details = {"module_file": _module_files(["torch.fx.graph"]), "routes": {}}
    found = []
    # 1. aten::random_.from, the overload x.random_(from, to) dispatches to (the reported crash)
    if make_fx is None:
        details["routes"][MAKE_FX_ROUTE] = "not run: this torch has no torch.fx.experimental.proxy_tensor"
    else:
        _fx_route(details, found, MAKE_FX_ROUTE, "random_(3, 7) under make_fx",
                  lambda: make_fx(_draw_from_to)(torch.zeros(4)),
                  lambda gm: _draws_within(gm(torch.zeros(256)), 3, 7, True),
                  "compiled; 256 draws in 3..6", "the traced x.random_(3, 7) drew values outside the integers 3..6")
    # 2. a keyword argument named `from` (Tensor.uniform_'s), recorded by FX's own tracer
    _fx_route(details, found, SYMBOLIC_TRACE_ROUTE, "uniform_(**{'from': 2.0, 'to': 3.0}) under fx.symbolic_trace",
              lambda: fx.symbolic_trace(_uniform_from_keyword),
              lambda gm: _draws_within(gm(torch.zeros(256)), 2.0, 3.0, False),
              "compiled; 256 draws in [2, 3]", "the traced uniform_(from=2.0, to=3.0) drew values outside [2, 3]")
    if found:
        raise Finding("FX generated code that does not compile for %s: the trace fails with a "
                      "SyntaxError (CVE-2025-55553)" % " and ".join(found), details)
    return details
