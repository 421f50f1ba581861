"""max_pool2d on CUDA: the flagship 1.4 bug (#34083) and a broad sweep against a CPU reference.

Inputs are made without touching torch's random state: the sweep uses a hash of the
element index (integers in [-2046, 2046], exact in fp16 and fp32, so both dtypes share
one CPU reference); the large-channel check uses a per-plane permutation (no ties at all).
The sweep has ties (4093 distinct values), so an index that differs from the CPU's is
accepted when it points at an element holding the same maximum.
"""

from ..framework import Fail, check

SWEEP_SIZES = (224, 255, 256, 511, 512)
SWEEP_BATCHES = (1, 2, 3, 31, 32)
SWEEP_LAYOUTS = ("contiguous", "channels_last", "permuted_nhwc")
SWEEP_CHANNELS = 3
POOL = (3, 2, 1)  # kernel, stride, padding (the ResNet stem)

# FACTS.md: in 1.4 the NHWC forward fails from about C >= 193 fp32, 257 fp16, 129 fp64
# (dynamic shared memory per block past 48 KiB); one case each side of every threshold.
LARGE_CHANNEL_CASES = (
    (4, 128, 28, 28, "float64"), (4, 129, 28, 28, "float64"),
    (4, 192, 28, 28, "float32"), (4, 193, 28, 28, "float32"),
    (4, 256, 28, 28, "float16"), (4, 257, 28, 28, "float16"),
    (8, 512, 28, 28, "float16"),  # the (200, 512, 28, 28) report, batch shrunk
)


def hashed_values(torch, shape, device):
    """Pseudo-random integers in [-2046, 2046] from the element index (no RNG state)."""
    count = 1
    for n in shape:
        count *= n
    index = torch.arange(count, dtype=torch.int64, device=device)
    # an affine step then a square, modulo 2**31 - 1: products stay inside int64
    mixed = torch.remainder(index * 48271 + 12345, 2147483647)
    mixed = torch.remainder(mixed * mixed, 2147483647)
    return (torch.remainder(mixed, 4093) - 2046).to(torch.float32).view(*shape)


def as_layout(torch, x, layout):
    """The same logical tensor in one of three memory layouts."""
    if layout == "contiguous":
        return x.contiguous()
    if layout == "channels_last":
        memory_format = getattr(torch, "channels_last", None)
        if memory_format is None:
            return None
        return x.contiguous(memory_format=memory_format)
    # NHWC data seen through a permuted view: channels-last strides without the format flag
    return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def sweep_cases(sizes=SWEEP_SIZES, batches=SWEEP_BATCHES, layouts=SWEEP_LAYOUTS,
                dtypes=("float32", "float16")):
    return [(size, batch, layout, dtype) for size in sizes for dtype in dtypes
            for layout in layouts for batch in batches]


def sweep_batched(torch, sizes=SWEEP_SIZES, batches=SWEEP_BATCHES, layouts=SWEEP_LAYOUTS,
                  dtypes=("float32", "float16"), device="cuda"):
    """Every case on the GPU against one CPU reference per size, compared on the device;
    the only host synchronisation is one copy of all mismatch counts at the end."""
    F = torch.nn.functional
    kernel, stride, padding = POOL
    largest = max(batches)
    cases, counts, unsupported = [], [], []
    for size in sizes:
        shape = (largest, SWEEP_CHANNELS, size, size)
        base = hashed_values(torch, shape, device)
        ref_values, ref_indices = F.max_pool2d(base.cpu(), kernel, stride, padding, return_indices=True)
        ref_values, ref_indices = ref_values.to(device), ref_indices.to(device)
        for dtype_name in dtypes:
            typed = base.to(getattr(torch, dtype_name))
            for layout in layouts:
                x = as_layout(torch, typed, layout)
                if x is None:
                    unsupported.append(layout)
                    continue
                for batch in batches:
                    xb = x[:batch]
                    values, indices = F.max_pool2d(xb, kernel, stride, padding, return_indices=True)
                    want_v, want_i = ref_values[:batch], ref_indices[:batch]
                    bad_values = (values.float() != want_v).sum()
                    # an index may differ on a tie: it must then point at the same maximum
                    pointed = xb.float().reshape(batch, SWEEP_CHANNELS, -1).gather(
                        2, indices.reshape(batch, SWEEP_CHANNELS, -1)).view_as(want_v)
                    bad_indices = ((indices != want_i) & (pointed != want_v)).sum()
                    counts.append(torch.stack([bad_values, bad_indices]))
                    cases.append((size, batch, layout, dtype_name))
    totals = torch.stack(counts).cpu().tolist() if counts else []
    return cases, totals, sorted(set(unsupported))


def sweep_naive(torch, sizes=SWEEP_SIZES, batches=SWEEP_BATCHES, layouts=SWEEP_LAYOUTS,
                dtypes=("float32", "float16"), device="cuda"):
    """The same cases one at a time: CPU input, copy in, pool, copy out, CPU reference,
    compare on the host.  Kept as the benchmark's baseline for sweep_batched."""
    F = torch.nn.functional
    kernel, stride, padding = POOL
    cases, totals = [], []
    for size, batch, layout, dtype_name in sweep_cases(sizes, batches, layouts, dtypes):
        host = hashed_values(torch, (batch, SWEEP_CHANNELS, size, size), "cpu")
        x = as_layout(torch, host.to(device).to(getattr(torch, dtype_name)), layout)
        if x is None:
            continue
        values, indices = F.max_pool2d(x, kernel, stride, padding, return_indices=True)
        values, indices = values.float().cpu(), indices.cpu()
        want_v, want_i = F.max_pool2d(host, kernel, stride, padding, return_indices=True)
        bad_values = int((values != want_v).sum())
        pointed = host.reshape(batch, SWEEP_CHANNELS, -1).gather(
            2, indices.reshape(batch, SWEEP_CHANNELS, -1)).view_as(want_v)
        bad_indices = int(((indices != want_i) & (pointed != want_v)).sum())
        cases.append((size, batch, layout, dtype_name))
        totals.append([bad_values, bad_indices])
    return cases, totals, []


@check("maxpool2d.sweep", torch=">=1.4", device="cuda", timeout=300)
def sweep(ctx):
    torch = ctx.torch
    cases, totals, unsupported = sweep_batched(torch)
    torch.cuda.synchronize()
    wrong = []
    for case, (bad_values, bad_indices) in zip(cases, totals):
        if bad_values or bad_indices:
            wrong.append({"size": case[0], "batch": case[1], "layout": case[2], "dtype": case[3],
                          "wrong_values": int(bad_values), "wrong_indices": int(bad_indices)})
    details = {"cases": len(cases), "pool": {"kernel": POOL[0], "stride": POOL[1], "padding": POOL[2]},
               "channels": SWEEP_CHANNELS, "sizes": list(SWEEP_SIZES), "batches": list(SWEEP_BATCHES),
               "layouts": list(SWEEP_LAYOUTS), "dtypes": ["float32", "float16"]}
    if unsupported:
        ctx.log("layouts this torch cannot express, not run: %s" % ", ".join(unsupported))
    if wrong:
        details["wrong"] = wrong
        first = wrong[0]
        raise Fail("max_pool2d differs from the CPU in %d of %d cases (first: %dx%d batch %d %s %s)"
                   % (len(wrong), len(cases), first["size"], first["size"], first["batch"],
                      first["layout"], first["dtype"]), details)
    return details


def plane_permutation(torch, shape, seed):
    """Each (n, c) plane holds a permutation of 0..H*W-1 minus H*W/2: no ties, exact in fp16."""
    n, c, h, w = shape
    generator = torch.Generator()
    generator.manual_seed(seed)
    order = torch.argsort(torch.rand(n * c, h * w, generator=generator), dim=1)
    return (order - (h * w) // 2).to(torch.float64).view(n, c, h, w)


def small_integers(torch, shape, seed):
    """Gradients in [-3, 3]: their sums are exact in every dtype, so backward compares bitwise."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=generator).to(torch.float64)


def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def large_channel_results(torch, cases=LARGE_CHANNEL_CASES, device="cuda"):
    """Forward (values, indices) and backward of channels-last max_pool2d on ``device``
    against a contiguous fp64 CPU reference; returns (every case, the wrong ones)."""
    F = torch.nn.functional
    kernel, stride, padding = POOL
    results, wrong = [], []
    for index, (n, c, h, w, dtype_name) in enumerate(cases):
        dtype = getattr(torch, dtype_name)
        host = plane_permutation(torch, (n, c, h, w), seed=index)
        reference = host.clone().requires_grad_(True)
        want_v, want_i = F.max_pool2d(reference, kernel, stride, padding, return_indices=True)
        grad_out = small_integers(torch, tuple(want_v.shape), seed=1000 + index)
        want_v.backward(grad_out)
        x = as_layout(torch, host.to(device).to(dtype), "channels_last")
        if x is None:
            x = as_layout(torch, host.to(device).to(dtype), "permuted_nhwc")
        x.requires_grad_(True)
        case = {"shape": [n, c, h, w], "dtype": dtype_name}
        results.append(case)
        try:
            values, indices = F.max_pool2d(x, kernel, stride, padding, return_indices=True)
            _sync(torch, device)
        except RuntimeError as exc:
            case["forward"] = "launch failed: %s" % str(exc).splitlines()[0]
            wrong.append(case)
            continue
        same = torch.equal(values.double().cpu(), want_v.detach()) and torch.equal(indices.cpu(), want_i)
        case["forward"] = "ok" if same else "differs from CPU"
        try:
            values.backward(grad_out.to(device).to(dtype))
            _sync(torch, device)
            case["backward"] = "ok" if torch.equal(x.grad.double().cpu(), reference.grad) else "differs from CPU"
        except RuntimeError as exc:
            case["backward"] = "launch failed: %s" % str(exc).splitlines()[0]
        if case["forward"] != "ok" or case["backward"] != "ok":
            wrong.append(case)
    return results, wrong


@check("maxpool2d.nhwc_large_channels", torch=">=1.4", device="cuda", patches=("PT-0001",), timeout=300)
def nhwc_large_channels(ctx):
    torch = ctx.torch
    results, wrong = large_channel_results(torch)
    kernel, stride, padding = POOL
    details = {"cases": results, "pool": {"kernel": kernel, "stride": stride, "padding": padding},
               "layout": "channels_last" if getattr(torch, "channels_last", None) is not None else "permuted_nhwc"}
    if wrong:
        first = wrong[0]
        raise Fail("channels-last max_pool2d is wrong for %d of %d large-channel cases (first: %s %s: %s)"
                   % (len(wrong), len(results), tuple(first["shape"]), first["dtype"],
                      first.get("backward") if first.get("forward") == "ok" else first["forward"]), details)
    return details


# Large enough that an NHWC kernel keeping a block's channels in shared memory cannot launch.
PROVOCATIONS = ((2, 4096, 16, 16, "float32"), (2, 4096, 16, 16, "float64"), (2, 8192, 16, 16, "float16"))
ERROR_CODE_ZERO = ("error code 0", "error code: 0")


def provoke_launch_failures(torch, provocations=PROVOCATIONS, device="cuda"):
    """Run channels-last max_pool2d forward and backward on huge channel counts; return
    (every RuntimeError seen, the misreported ones)."""
    F = torch.nn.functional
    kernel, stride, padding = POOL
    failures, misreported = [], []
    for n, c, h, w, dtype_name in provocations:
        data = hashed_values(torch, (n, c, h, w), device).to(getattr(torch, dtype_name))
        x = as_layout(torch, data, "channels_last")
        if x is None:
            x = as_layout(torch, data, "permuted_nhwc")
        x.requires_grad_(True)
        values = None
        for phase in ("forward", "backward"):
            try:
                if phase == "forward":
                    values = F.max_pool2d(x, kernel, stride, padding)
                else:
                    values.sum().backward()
                _sync(torch, device)
            except RuntimeError as exc:
                message = str(exc).splitlines()[0]
                record = {"shape": [n, c, h, w], "dtype": dtype_name, "phase": phase, "message": message}
                failures.append(record)
                if is_misreported(message, phase):
                    misreported.append(record)
                if phase == "forward":
                    break
    return failures, misreported


def is_misreported(message, phase):
    lowered = message.lower()
    if any(text in lowered for text in ERROR_CODE_ZERO):
        return True
    # 1.4's max_pool2d backward reports itself as fractional_max_pool2d (#34450)
    return phase == "backward" and "fractional_max_pool2d" in lowered


@check("maxpool2d.error_message", torch=">=1.4", device="cuda", patches=("PT-0001",))
def error_message(ctx):
    """A failed launch must be reported with its real error, never 'error code 0', and
    under the name of the function that failed."""
    failures, misreported = provoke_launch_failures(ctx.torch)
    details = {"provoked": [{"shape": list(p[:4]), "dtype": p[4]} for p in PROVOCATIONS], "failures": failures}
    if misreported:
        first = misreported[0]
        raise Fail("a failed max_pool2d launch is misreported: %r (%s %s %s)"
                   % (first["message"], tuple(first["shape"]), first["dtype"], first["phase"]), details)
    if not failures:
        ctx.log("no launch failed on this build (its NHWC kernel fits any channel count): nothing to misreport")
    return details
