"""Deterministic mode on CUDA, one check per operation upstream leaves without a
deterministic implementation (the use_deterministic_algorithms docstring; FACTS.md).

Each check measures two things:

* ``unflagged``: the operation run REPEATS times with deterministic mode off, results
  compared bitwise with the first run: "deterministic" or "nondeterministic";
* ``flagged``: the same with the flag on (1.7 ``torch.set_deterministic``, 1.8+
  ``torch.use_deterministic_algorithms``): "raises" (the "does not have a deterministic
  implementation" error), "warns" (ran, but warned), "deterministic" or
  "nondeterministic".  From 1.11 a raising operation is also run with ``warn_only=True``.

A pass means the operation is deterministic under the flag.  Anything else is a
``Finding``: an upstream gap, not required unless the wheel carries the patch that closes
it (PT-0201 adaptive_max_pool2d, PT-0202 grid_sampler_2d, PT-0203 .. PT-0211 for pooling,
padding, interpolation and unpooling, PT-0222 grid_sampler_3d, PT-0230/PT-0231 the scatter and
index reductions, PT-0232 antialiased interpolation: see OPERATIONS).  Without a flag (torch < 1.7)
the unflagged result decides.  The flag and its warn-only setting are restored afterwards.
"""

import warnings

from ..framework import Finding, check

REPEATS = 3
NOT_DETERMINISTIC = "does not have a deterministic implementation"


# --- inputs: seeded CPU generators, so every run sees the same numbers ----------------------
def _generator(torch, seed):
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _randn(torch, shape, seed, device, requires_grad=False):
    x = torch.randn(*shape, generator=_generator(torch, seed)).to(device)
    return x.requires_grad_(True) if requires_grad else x


def _grads_of(torch, output, inputs, seed):
    grad = torch.randn(*output.shape, generator=_generator(torch, seed)).to(output.device)
    output.backward(grad.to(output.dtype))
    return [x.grad for x in inputs]


# --- the operations: each returns the tensors two identical runs must reproduce ----------------
def op_adaptive_max_pool2d(torch, device):
    # FACTS.md's shape: 32x256x33x33 -> 7x7, overlapping windows
    x = _randn(torch, (32, 256, 33, 33), 1, device, True)
    return _grads_of(torch, torch.nn.functional.adaptive_max_pool2d(x, 7), [x], 2)


def op_grid_sampler_2d(torch, device):
    x = _randn(torch, (8, 64, 128, 128), 3, device, True)
    grid = (torch.rand(8, 128, 128, 2, generator=_generator(torch, 4)) * 2 - 1).to(device)
    out = torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return _grads_of(torch, out, [x], 5)


def op_grid_sampler_3d(torch, device):
    # trilinear over a 24^3 grid: neighbouring grid points share voxels
    x = _randn(torch, (4, 16, 24, 24, 24), 57, device, True)
    grid = (torch.rand(4, 24, 24, 24, 3, generator=_generator(torch, 58)) * 2 - 1).to(device)
    out = torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return _grads_of(torch, out, [x], 59)


def op_avg_pool3d(torch, device):
    x = _randn(torch, (4, 16, 24, 24, 24), 6, device, True)
    return _grads_of(torch, torch.nn.functional.avg_pool3d(x, 3, stride=1, padding=1), [x], 7)


def op_adaptive_avg_pool2d(torch, device):
    x = _randn(torch, (16, 64, 33, 33), 8, device, True)
    return _grads_of(torch, torch.nn.functional.adaptive_avg_pool2d(x, 7), [x], 9)


def op_adaptive_avg_pool3d(torch, device):
    x = _randn(torch, (4, 16, 17, 17, 17), 10, device, True)
    return _grads_of(torch, torch.nn.functional.adaptive_avg_pool3d(x, 5), [x], 11)


def op_fractional_max_pool2d(torch, device):
    x = _randn(torch, (16, 32, 64, 64), 12, device, True)
    samples = torch.rand(16, 32, 2, generator=_generator(torch, 13)).to(device)
    out = torch.nn.functional.fractional_max_pool2d(x, 3, output_size=(40, 40), _random_samples=samples)
    return _grads_of(torch, out, [x], 14)


def op_max_unpool2d(torch, device):
    x = _randn(torch, (16, 32, 64, 64), 15, device)
    pooled, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    pooled.requires_grad_(True)
    out = torch.nn.functional.max_unpool2d(pooled, indices, 2)
    return [out.detach()] + _grads_of(torch, out, [pooled], 16)


def op_interpolate_bilinear(torch, device):
    x = _randn(torch, (16, 32, 48, 48), 17, device, True)
    out = torch.nn.functional.interpolate(x, scale_factor=2.5, mode="bilinear", align_corners=False)
    return _grads_of(torch, out, [x], 18)


def op_reflection_pad2d(torch, device):
    x = _randn(torch, (16, 32, 32, 32), 19, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (7, 7, 7, 7), mode="reflect"), [x], 20)


def op_reflection_pad1d(torch, device):
    x = _randn(torch, (16, 32, 256), 34, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (31, 17), mode="reflect"), [x], 35)


def op_reflection_pad3d(torch, device):
    x = _randn(torch, (4, 16, 16, 16, 16), 36, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (3,) * 6, mode="reflect"), [x], 37)


def op_replication_pad1d(torch, device):
    x = _randn(torch, (16, 32, 256), 38, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (40, 40), mode="replicate"), [x], 39)


def op_replication_pad2d(torch, device):
    x = _randn(torch, (16, 32, 32, 32), 40, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (9, 9, 9, 9), mode="replicate"), [x], 41)


def op_replication_pad3d(torch, device):
    x = _randn(torch, (4, 16, 16, 16, 16), 42, device, True)
    return _grads_of(torch, torch.nn.functional.pad(x, (5,) * 6, mode="replicate"), [x], 43)


def op_interpolate_linear(torch, device):
    x = _randn(torch, (16, 32, 200), 44, device, True)
    out = torch.nn.functional.interpolate(x, scale_factor=2.5, mode="linear", align_corners=False)
    return _grads_of(torch, out, [x], 45)


def op_interpolate_bicubic(torch, device):
    x = _randn(torch, (8, 16, 48, 48), 46, device, True)
    out = torch.nn.functional.interpolate(x, scale_factor=2.5, mode="bicubic", align_corners=False)
    return _grads_of(torch, out, [x], 47)


def op_interpolate_bilinear_aa(torch, device):
    # antialiased downsampling (an image pipeline's resize): every output spans about 5x5 inputs
    x = _randn(torch, (8, 32, 96, 96), 67, device, True)
    out = torch.nn.functional.interpolate(x, size=(40, 40), mode="bilinear", align_corners=False, antialias=True)
    return _grads_of(torch, out, [x], 68)


def op_interpolate_bicubic_aa(torch, device):
    x = _randn(torch, (8, 32, 96, 96), 69, device, True)
    out = torch.nn.functional.interpolate(x, size=(40, 40), mode="bicubic", align_corners=False, antialias=True)
    return _grads_of(torch, out, [x], 70)


def op_interpolate_trilinear(torch, device):
    x = _randn(torch, (4, 16, 12, 12, 12), 48, device, True)
    out = torch.nn.functional.interpolate(x, scale_factor=2.5, mode="trilinear", align_corners=False)
    return _grads_of(torch, out, [x], 49)


def op_max_pool3d(torch, device):
    x = _randn(torch, (4, 16, 24, 24, 24), 50, device, True)
    return _grads_of(torch, torch.nn.functional.max_pool3d(x, 3, stride=2, padding=1), [x], 51)


def op_fractional_max_pool3d(torch, device):
    x = _randn(torch, (4, 16, 24, 24, 24), 52, device, True)
    samples = torch.rand(4, 16, 3, generator=_generator(torch, 53)).to(device)
    out = torch.nn.functional.fractional_max_pool3d(x, 3, output_size=(16, 16, 16), _random_samples=samples)
    return _grads_of(torch, out, [x], 54)


def op_max_unpool3d(torch, device):
    x = _randn(torch, (4, 16, 16, 16, 16), 55, device)
    pooled, indices = torch.nn.functional.max_pool3d(x, 2, return_indices=True)
    pooled.requires_grad_(True)
    out = torch.nn.functional.max_unpool3d(pooled, indices, 2)
    return [out.detach()] + _grads_of(torch, out, [pooled], 56)


def op_nll_loss2d(torch, device):
    logits = _randn(torch, (16, 21, 64, 64), 21, device, True)
    target = torch.randint(0, 21, (16, 64, 64), generator=_generator(torch, 22)).to(device)
    weight = torch.rand(21, generator=_generator(torch, 23)).to(device)
    loss = torch.nn.functional.nll_loss(torch.nn.functional.log_softmax(logits, 1), target, weight=weight)
    loss.backward()
    return [loss.detach(), logits.grad]


def op_ctc_loss(torch, device):
    steps, batch, classes, target_len = 50, 16, 20, 20
    logits = _randn(torch, (steps, batch, classes), 24, device, True)
    targets = torch.randint(1, classes, (batch, target_len), generator=_generator(torch, 25)).to(device)
    input_lengths = torch.full((batch,), steps, dtype=torch.long)
    target_lengths = torch.randint(10, target_len + 1, (batch,), generator=_generator(torch, 26))
    loss = torch.nn.functional.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths)
    loss.backward()
    return [loss.detach(), logits.grad]


def op_embedding_bag_max(torch, device):
    weight = _randn(torch, (1000, 64), 27, device, True)
    indices = torch.randint(0, 1000, (4096,), generator=_generator(torch, 28)).to(device)
    offsets = torch.arange(0, 4096, 8).to(device)
    out = torch.nn.functional.embedding_bag(indices, weight, offsets, mode="max")
    return _grads_of(torch, out, [weight], 29)


def op_nll_loss(torch, device):
    # 1-D nll_loss (a row of class scores per sample), class-weighted mean
    logits = _randn(torch, (4096, 100), 61, device, True)
    target = torch.randint(0, 100, (4096,), generator=_generator(torch, 62)).to(device)
    weight = torch.rand(100, generator=_generator(torch, 63)).to(device)
    loss = torch.nn.functional.nll_loss(torch.nn.functional.log_softmax(logits, 1), target, weight=weight)
    loss.backward()
    return [loss.detach(), logits.grad]


def _put_inputs(torch, device):
    # 2^18 values onto 2^10 of 2^16 elements: every touched element receives many
    index = torch.randint(0, 1 << 10, (1 << 18,), generator=_generator(torch, 64)).to(device)
    source = torch.randn(1 << 18, generator=_generator(torch, 65)).to(device)
    return torch.zeros(1 << 16, device=device), index, source


def op_put_accumulate(torch, device):
    self, index, source = _put_inputs(torch, device)
    return [self.put_(index, source, accumulate=True)]


def op_put(torch, device):
    self, index, source = _put_inputs(torch, device)
    return [self.put_(index, source, accumulate=False)]


def op_histc(torch, device):
    x = _randn(torch, (1 << 20,), 30, device)
    return [torch.histc(x, bins=97, min=-3, max=3)]


def op_bincount(torch, device):
    values = torch.randint(0, 100, (1 << 20,), generator=_generator(torch, 31)).to(device)
    weights = torch.rand(1 << 20, generator=_generator(torch, 32)).to(device)
    return [torch.bincount(values, weights=weights, minlength=100)]


def op_cumsum(torch, device):
    x = _randn(torch, (1 << 20,), 33, device)
    return [torch.cumsum(x, 0)]


def op_bincount_unweighted(torch, device):
    values = torch.randint(0, 100, (1 << 20,), generator=_generator(torch, 57)).to(device)
    return [torch.bincount(values, minlength=100)]


def _tied(torch, shape, seed, device):
    # few distinct values: which of the equal elements supplies the index is the question
    return torch.randint(0, 4, shape, generator=_generator(torch, seed)).to(device).float()


def op_kthvalue(torch, device):
    values, indices = torch.kthvalue(_tied(torch, (256, 1024), 58, device), 300, 1)
    return [values, indices]


def op_median_indices(torch, device):
    x = _tied(torch, (256, 1024), 59, device)
    values, indices = torch.median(x, 1)
    return [values, indices]


def op_cumsum_complex(torch, device):
    x = _randn(torch, (1 << 19, 2), 60, device)
    return [torch.cumsum(torch.complex(x[:, 0], x[:, 1]), 0)]


def op_scatter_reduce_prod(torch, device):
    # a product of many values per target: its rounding depends on the order
    src = 1 + 0.01 * _randn(torch, (1 << 16, 8), 61, device)
    index = torch.randint(0, 64, (1 << 16, 8), generator=_generator(torch, 62)).to(device)
    return [torch.ones(64, 8, device=device).scatter_reduce_(0, index, src, "prod")]


def op_scatter_multiply(torch, device):
    # scatter_ with reduce="multiply": the same atomic products, without an alert in 1.13.1
    src = 1 + 0.01 * _randn(torch, (1 << 16, 8), 65, device)
    index = torch.randint(0, 64, (1 << 16, 8), generator=_generator(torch, 66)).to(device)
    return [torch.ones(64, 8, device=device).scatter_(0, index, src, reduce="multiply")]


def op_index_reduce_prod(torch, device):
    src = 1 + 0.01 * _randn(torch, (1 << 16, 8), 63, device)
    index = torch.randint(0, 64, (1 << 16,), generator=_generator(torch, 64)).to(device)
    return [torch.ones(64, 8, device=device).index_reduce_(0, index, src, "prod")]


# id suffix -> (operation, phase the gap is in, patches that close it)
OPERATIONS = (
    ("adaptive_max_pool2d", op_adaptive_max_pool2d, "backward", ("PT-0201",)),
    ("grid_sampler_2d", op_grid_sampler_2d, "backward", ("PT-0202",)),
    ("grid_sampler_3d", op_grid_sampler_3d, "backward", ("PT-0222",)),
    ("avg_pool3d", op_avg_pool3d, "backward", ("PT-0203",)),
    ("adaptive_avg_pool2d", op_adaptive_avg_pool2d, "backward", ("PT-0204",)),
    ("adaptive_avg_pool3d", op_adaptive_avg_pool3d, "backward", ("PT-0205",)),
    ("reflection_pad1d", op_reflection_pad1d, "backward", ("PT-0206",)),
    ("reflection_pad2d", op_reflection_pad2d, "backward", ("PT-0206",)),
    ("reflection_pad3d", op_reflection_pad3d, "backward", ("PT-0206",)),
    ("replication_pad1d", op_replication_pad1d, "backward", ("PT-0207",)),
    ("replication_pad2d", op_replication_pad2d, "backward", ("PT-0207",)),
    ("replication_pad3d", op_replication_pad3d, "backward", ("PT-0207",)),
    ("interpolate_linear", op_interpolate_linear, "backward", ("PT-0208",)),
    ("interpolate_bilinear", op_interpolate_bilinear, "backward", ("PT-0208",)),
    ("interpolate_bicubic", op_interpolate_bicubic, "backward", ("PT-0208",)),
    ("interpolate_trilinear", op_interpolate_trilinear, "backward", ("PT-0208",)),
    ("interpolate_bilinear_aa", op_interpolate_bilinear_aa, "backward", ("PT-0232",)),
    ("interpolate_bicubic_aa", op_interpolate_bicubic_aa, "backward", ("PT-0232",)),
    ("max_pool3d", op_max_pool3d, "backward", ("PT-0209",)),
    ("fractional_max_pool2d", op_fractional_max_pool2d, "backward", ("PT-0210",)),
    ("fractional_max_pool3d", op_fractional_max_pool3d, "backward", ("PT-0210",)),
    ("max_unpool2d", op_max_unpool2d, "forward", ("PT-0211",)),
    ("max_unpool3d", op_max_unpool3d, "forward", ("PT-0211",)),
    ("nll_loss2d", op_nll_loss2d, "forward", ("PT-0212",)),
    ("nll_loss", op_nll_loss, "forward", ("PT-0212",)),
    ("ctc_loss", op_ctc_loss, "backward", ("PT-0213",)),
    ("embedding_bag_max", op_embedding_bag_max, "backward", ("PT-0214",)),
    ("put_accumulate", op_put_accumulate, "forward", ("PT-0215",)),
    ("put", op_put, "forward", ("PT-0215",)),
    ("histc", op_histc, "forward", ("PT-0217",)),
    ("bincount", op_bincount, "forward", ("PT-0218",)),
    ("bincount_unweighted", op_bincount_unweighted, "forward", ("PT-0218",)),
    ("kthvalue", op_kthvalue, "forward", ("PT-0219",)),
    ("median_indices", op_median_indices, "forward", ("PT-0220",)),
    ("cumsum", op_cumsum, "forward", ("PT-0221",)),
    ("cumsum_complex", op_cumsum_complex, "forward", ("PT-0221",)),
    ("scatter_reduce_prod", op_scatter_reduce_prod, "forward", ("PT-0230",)),
    ("scatter_multiply", op_scatter_multiply, "forward", ("PT-0230",)),
    ("index_reduce_prod", op_index_reduce_prod, "forward", ("PT-0231",)),
)


# torch ranges narrower than ">=1.4": F.pad(mode="reflect") on 5-D input (reflection_pad3d)
# first exists in 1.10; torch.complex (cumsum_complex) in 1.8; scatter_reduce_ and index_reduce_
# with reduce="prod" are both in 1.13; scatter_ with reduce="multiply" is older (1.7) but checked
# from 1.13 with the scatter_reduce family its patch (PT-0230) covers; interpolate(antialias=True)
# has a CUDA kernel from 1.12 (pytorch/pytorch#70930).
TORCH_RANGES = {"reflection_pad3d": ">=1.10", "cumsum_complex": ">=1.8", "scatter_reduce_prod": ">=1.13",
                "scatter_multiply": ">=1.13", "index_reduce_prod": ">=1.13", "interpolate_bilinear_aa": ">=1.12",
                "interpolate_bicubic_aa": ">=1.12"}


# --- the deterministic flag across releases --------------------------------------------------
class DeterministicFlag(object):
    """Turn the flag on for a block and restore what was there before."""

    def __init__(self, torch, warn_only=False):
        self.torch = torch
        self.warn_only = warn_only
        self.api = flag_api(torch)

    def __enter__(self):
        torch = self.torch
        if self.api == "use_deterministic_algorithms":
            self.was_on = torch.are_deterministic_algorithms_enabled()
            self.was_warn_only = _warn_only_enabled(torch)
            if self.warn_only:
                torch.use_deterministic_algorithms(True, warn_only=True)
            else:
                torch.use_deterministic_algorithms(True)
        elif self.api == "set_deterministic":
            self.was_on = torch.is_deterministic()
            torch.set_deterministic(True)
        return self

    def __exit__(self, *exc_info):
        torch = self.torch
        if self.api == "use_deterministic_algorithms":
            if self.was_warn_only is None:
                torch.use_deterministic_algorithms(self.was_on)
            else:
                torch.use_deterministic_algorithms(self.was_on, warn_only=self.was_warn_only)
        elif self.api == "set_deterministic":
            torch.set_deterministic(self.was_on)
        return False


def flag_api(torch):
    if hasattr(torch, "use_deterministic_algorithms"):
        return "use_deterministic_algorithms"
    if hasattr(torch, "set_deterministic"):
        return "set_deterministic"
    return None


def _warn_only_enabled(torch):
    getter = getattr(torch, "is_deterministic_algorithms_warn_only_enabled", None)
    return getter() if getter is not None else None


def _same(torch, first, second):
    return len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def repeat_runs(torch, operation, device, repeats):
    """'deterministic' when every run equals the first bitwise, else 'nondeterministic'
    and how many runs differed."""
    first = [t.detach().clone() for t in operation(torch, device)]
    differing = 0
    for _ in range(repeats - 1):
        again = operation(torch, device)
        if not _same(torch, first, again):
            differing += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return ("nondeterministic" if differing else "deterministic"), differing


def first_line(exc):
    """The error's own words, without torch's advice that follows them."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(", but you set")[0]


def measure(torch, operation, device="cuda", repeats=REPEATS):
    """The details every determinism check records (see the module docstring)."""
    details = {"repeats": repeats, "flag": flag_api(torch)}
    state, differing = repeat_runs(torch, operation, device, repeats)
    details["unflagged"] = state
    details["unflagged_differing_runs"] = differing
    if details["flag"] is None:
        details["flagged"] = None
        return details
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with DeterministicFlag(torch):
                state, differing = repeat_runs(torch, operation, device, repeats)
            details["flagged"] = state
            details["flagged_differing_runs"] = differing
        except RuntimeError as exc:
            if "deterministic" not in str(exc):
                raise
            details["flagged"] = "raises"
            details["error"] = first_line(exc)
    noted = [str(w.message).splitlines()[0] for w in caught if "determinis" in str(w.message)]
    if noted and details["flagged"] != "raises":
        details["warning"] = noted[0]
        if details["flagged"] == "deterministic":
            details["flagged"] = "warns"
    if details["flagged"] == "raises" and _warn_only_enabled(torch) is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with DeterministicFlag(torch, warn_only=True):
                operation(torch, device)
        noted = [str(w.message).splitlines()[0] for w in caught if "determinis" in str(w.message)]
        details["warn_only"] = "warns" if noted else "silent"
    return details


def verdict(name, phase, details):
    """None for a pass, else the finding's message."""
    flagged = details["flagged"]
    if flagged is None:
        if details["unflagged"] == "deterministic":
            return None
        return ("CUDA %s of %s differed bitwise in %d of %d repeats, and this torch has no deterministic flag"
                % (phase, name, details["unflagged_differing_runs"], details["repeats"] - 1))
    if flagged == "deterministic":
        return None
    api = "torch.%s(True)" % details["flag"]
    if flagged == "raises":
        return "under %s the CUDA %s of %s raises: %s" % (api, phase, name, details["error"])
    if flagged == "warns":
        return "under %s the CUDA %s of %s warns: %s" % (api, phase, name, details["warning"])
    return ("under %s the CUDA %s of %s is still nondeterministic (%d of %d repeats differed)"
            % (api, phase, name, details["flagged_differing_runs"], details["repeats"] - 1))


def _register(name, operation, phase, patches):
    def determinism_check(ctx):
        details = measure(ctx.torch, operation)
        message = verdict(name, phase, details)
        if message is not None:
            raise Finding(message, details)
        return details

    determinism_check.__name__ = "determinism_" + name
    check("determinism." + name, torch=TORCH_RANGES.get(name, ">=1.4"), device="cuda", patches=patches,
          required=False)(
        determinism_check)


for _name, _operation, _phase, _patches in OPERATIONS:
    _register(_name, _operation, _phase, _patches)
