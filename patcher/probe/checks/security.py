"""Security checks: one per backported CVE fix (patches PT-0101 to PT-0105).

Each check feeds the vulnerable entry point a harmless trigger and passes when the input is
refused cleanly.  A stock torch that still has the defect fails the check; the checks are not
required on their own (a survey of a stock wheel reports them as failures without failing the
run) and become required when the wheel carries the patch that each one proves.

Triggers that can crash the interpreter (SIGFPE, out-of-bounds reads in the mobile
interpreter) run with ``isolate=True``: the framework runs them in a child process and reports
the signal as a failure.  Before each trigger a control call (the same entry point with valid
input) must work, so that a torch which refuses everything cannot pass by accident.
"""

import io
import pickle
import sys
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
