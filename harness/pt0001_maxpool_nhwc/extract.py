"""Cut the pieces the PT-0001 GPU harness compiles out of a 1.4-era DilatedMaxPool2d.cu.

The harness does not carry its own copy of the kernels: it takes them, and the
channels-last launch configuration, verbatim from the file (the vendored v1.4.0
reference, or that file with the PT-0001 patch applied), so what runs on the GPU
is exactly what the patch says. Standard library only.
"""

import re

FWD_FN = "void max_pool2d_with_indices_out_cuda_template("
BWD_FN = "void max_pool2d_with_indices_backward_out_cuda_template("
CASE = "case MemoryFormat::ChannelsLast: {"
DISPATCH = "AT_DISPATCH_FLOATING_TYPES_AND_HALF("


class ExtractError(ValueError):
    pass


def _match(text, start, open_ch, close_ch):
    """Index just past the bracket that closes the one at text[start]."""
    if text[start] != open_ch:
        raise ExtractError("expected %r at offset %d" % (open_ch, start))
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ExtractError("unbalanced %r from offset %d" % (open_ch, start))


def _one(text, needle, what):
    n = text.count(needle)
    if n != 1:
        raise ExtractError("%s: expected one %r, found %d" % (what, needle, n))
    return text.index(needle)


def _case(fn, what):
    at = _one(fn, CASE, what)
    end = _match(fn, at + len(CASE) - 1, "{", "}")
    return fn[at:end]


def _check(fn, what):
    """The statements between the end of the dtype dispatch and the next step."""
    at = _one(fn, DISPATCH, what)
    end = _match(fn, at + len(DISPATCH) - 1, "(", ")")
    if not fn.startswith(";", end):
        raise ExtractError("%s: dispatch not followed by ';'" % what)
    rest = fn[end + 1:]
    stop = rest.find("\n  if(input.ndimension() == 3)")
    if stop < 0:
        stop = rest.rindex("\n}")
    check = rest[:stop].strip("\n")
    if "cudaGetLastError" not in check:
        raise ExtractError("%s: no cudaGetLastError() after the dispatch" % what)
    return check


def extract(text):
    """Return {prelude, fwd_case, bwd_case, fwd_check, bwd_check} from the file text."""
    ns = _one(text, "namespace at {\nnamespace native {\nnamespace {\n", "namespaces")
    body_start = ns + len("namespace at {\nnamespace native {\nnamespace {\n")
    fwd_at = _one(text, FWD_FN, "forward template")
    bwd_at = _one(text, BWD_FN, "backward template")
    end_anon = text.index("} // namespace", bwd_at)
    fwd_fn = text[fwd_at:bwd_at]
    bwd_fn = text[bwd_at:end_anon]
    return {
        "prelude": text[body_start:fwd_at],
        "fwd_case": _case(fwd_fn, "forward"),
        "bwd_case": _case(bwd_fn, "backward"),
        "fwd_check": _check(fwd_fn, "forward"),
        "bwd_check": _check(bwd_fn, "backward"),
    }


def check_statements(text):
    """Every TORCH_CHECK(...) statement of the text, whole."""
    out = []
    for m in re.finditer(r"TORCH_CHECK\(", text):
        end = _match(text, m.end() - 1, "(", ")")
        out.append(text[m.start():end])
    return out
