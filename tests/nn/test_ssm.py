"""The selective scan: each fast form (the C++ kernels, the PyTorch loop) equals the sequential
reference (values, final state and every gradient, fp32, 1e-5), continues from a state exactly, and
the one-token step equals a scan of one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import quant_kernel
from attnlab.nn.ssm import backward_groups, selective_scan, selective_scan_ref, selective_step

TOL = 1e-5
IMPLS = ["torch"] + (["cpp"] if quant_kernel.kernel() == "cpp" else [])


def _scan(impl):
    return lambda *args, **maps: selective_scan(*args, **maps, impl=impl)


def _inputs(b, t, di, n, seed=0, with_h0=True):
    """Random scan inputs with the magnitudes of a trained model: Δ = softplus(·) around 0.01-1, A < 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, di, generator=g)
    delta = F.softplus(torch.randn(b, t, di, generator=g) - 2)
    A = -torch.exp(torch.randn(di, n, generator=g))
    B, C = torch.randn(b, t, n, generator=g), torch.randn(b, t, n, generator=g)
    D = torch.randn(di, generator=g)
    h0 = torch.randn(b, di, n, generator=g) if with_h0 else None
    return [x, delta, A, B, C, D, h0]


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Within TOL of the reference, relative to its largest magnitude (gradients sum over B·T terms)."""
    scale = max(1.0, b.abs().max().item())
    diff = (a - b).abs().max().item()
    assert diff <= TOL * scale, f"{what}: max |diff| {diff:.2e} > {TOL} × {scale:.2f}"


def _run(fn, args, **maps):
    args = [a.clone().requires_grad_() if a is not None else None for a in args]
    maps = {k: v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in maps.items()}
    y, h = fn(*args, **maps)
    g = torch.Generator().manual_seed(99)
    loss = (y * torch.randn(y.shape, generator=g)).sum() + (h * torch.randn(h.shape, generator=g)).sum()
    loss.backward()
    grads = [a.grad if a is not None else None for a in args]
    return y.detach(), h.detach(), grads + [v.grad for v in maps.values() if isinstance(v, torch.Tensor)]


NAMES = ["x", "delta", "A", "B", "C", "D", "h0"]


def _equal_to_reference(args, impl, **maps):
    y_ref, h_ref, g_ref = _run(selective_scan_ref, args, **maps)
    y, h, g = _run(_scan(impl), args, **maps)
    _close(y, y_ref, "y")
    _close(h, h_ref, "final state")
    for name, a, b in zip(NAMES + [k for k, v in maps.items() if isinstance(v, torch.Tensor)], g, g_ref):
        if b is not None:
            _close(a, b, f"d loss / d {name}")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", [1, 2, 7, 33, 64])
@pytest.mark.parametrize("with_h0", [False, True])
def test_fast_scan_equals_reference_values_state_and_gradients(t, with_h0, impl):
    _equal_to_reference(_inputs(3, t, 12, 5, seed=t, with_h0=with_h0), impl)


@pytest.mark.skipif("cpp" not in IMPLS, reason="the C++ extension does not build here")
@pytest.mark.parametrize("b,t,di,n", [(2, 300, 40, 16), (1, 257, 17, 32), (2, 129, 32, 3)])
def test_kernel_equals_reference_on_long_sequences(b, t, di, n):
    """Longer than one recomputed segment of the kernel's backward (128 steps), channels not a
    multiple of its 16 lanes, states by 16s and not (its two ways of summing ∂B and ∂C)."""
    _equal_to_reference(_inputs(b, t, di, n, seed=t), "cpp")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t,di,n", [(9, 12, 5), (200, 20, 16)])
@pytest.mark.parametrize("maps", ["z", "softplus", "all"])
def test_fused_maps_equal_reference(impl, t, di, n, maps):
    """The gate SiLU(z) and Δ = softplus(delta + delta_bias) (the Mamba block's maps), with and
    without D, values and gradients (z, delta_bias included); delta spans softplus's threshold 20."""
    g = torch.Generator().manual_seed(t)
    args = _inputs(2, t, di, n, seed=t)
    args[1] = torch.randn(2, t, di, generator=g) * 3 - 2            # before the softplus
    args[1][0, 0, :3] = torch.tensor([25.0, -30.0, 19.5])         # past, far below and near the threshold
    z, bias = torch.randn(2, t, di, generator=g), torch.randn(di, generator=g)
    if maps == "z":
        args[1] = F.softplus(args[1])
        _equal_to_reference(args, impl, z=z)
    elif maps == "softplus":
        args[5] = None
        _equal_to_reference(args, impl, delta_bias=bias, delta_softplus=True)
    else:
        _equal_to_reference(args, impl, z=z, delta_bias=bias, delta_softplus=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_scan_runs_fp32_under_bf16_autocast(impl):
    args = _inputs(2, 9, 8, 4)
    y_ref, h_ref = selective_scan_ref(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, h = selective_scan(*[a.clone().requires_grad_() for a in args], impl=impl)
    assert y.dtype == h.dtype == torch.float32
    _close(y, y_ref, "y")
    y.sum().backward()  # fp32 gradients meet fp32 saved tensors


def test_unknown_or_missing_impl_is_refused():
    args = _inputs(2, 3, 8, 4)
    with pytest.raises(ValueError, match="impl must be one of"):
        selective_scan(*args, impl="cuda")
    if "cpp" not in IMPLS:
        with pytest.raises(ValueError, match="not available"):
            selective_scan(*args, impl="cpp")


@pytest.mark.parametrize("impl", IMPLS)
def test_no_grad_path_equals_grad_path(impl):
    args = _inputs(2, 19, 8, 4)
    with torch.no_grad():
        y0, h0 = selective_scan(*args, impl=impl)
    y1, h1 = selective_scan(*[a.clone().requires_grad_() for a in args], impl=impl)
    assert torch.equal(y0, y1.detach()) and torch.equal(h0, h1.detach())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("split", [1, 5, 16])
def test_continuing_from_the_final_state_equals_one_scan(split, impl):
    """Prefill in pieces (the state carried over) == the whole sequence at once."""
    x, delta, A, B, C, D, _ = _inputs(2, 23, 8, 4, with_h0=False)
    scan = _scan(impl)
    y_all, h_all = scan(x, delta, A, B, C, D)
    y1, h1 = scan(x[:, :split], delta[:, :split], A, B[:, :split], C[:, :split], D)
    y2, h2 = scan(x[:, split:], delta[:, split:], A, B[:, split:], C[:, split:], D, h1)
    _close(torch.cat([y1, y2], 1), y_all, "y")
    _close(h2, h_all, "final state")


def test_step_equals_a_scan_of_one_and_updates_the_state_in_place():
    x, delta, A, B, C, D, h0 = _inputs(2, 1, 8, 4)
    y_scan, h_scan = selective_scan_ref(x, delta, A, B, C, D, h0)
    h = h0.clone()
    y = selective_step(x[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], D, h)
    _close(y, y_scan[:, 0], "y")
    _close(h, h_scan, "state")


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_delta_leaves_the_state_unchanged(impl):
    """Δ = 0 is how padding is skipped: Ā = 1 and B̄x = 0."""
    x, delta, A, B, C, D, h0 = _inputs(2, 6, 8, 4)
    _, h = selective_scan(x, torch.zeros_like(delta), A, B, C, D, h0, impl=impl)
    assert torch.equal(h, h0)


@pytest.mark.parametrize("impl", IMPLS)
def test_decays_over_the_whole_range_equal_reference(impl):
    """Δ·A from 0 down to far below exp's underflow (−87): the reference's values and gradients,
    states that forget everything (Ā = 0) included."""
    x, delta, A, B, C, D, h0 = _inputs(2, 40, 24, 16, seed=5)
    delta = torch.logspace(-6, 2, 40)[None, :, None].expand(2, 40, 24).contiguous()  # 1e-6 .. 100
    A = -torch.logspace(-3, 1.5, 24 * 16).view(24, 16)                               # −0.001 .. −31.6
    _equal_to_reference([x, delta, A, B, C, D, h0], impl)


def test_state_shape_and_dtype():
    x, delta, A, B, C, D, _ = _inputs(2, 5, 8, 4, with_h0=False)
    y, h = selective_scan(x.double(), delta, A, B, C, D)
    assert y.shape == (2, 5, 8) and y.dtype == torch.float64
    assert h.shape == (2, 8, 4) and h.dtype == torch.float32


def test_mismatched_shapes_are_named():
    x, delta, A, B, C, D, _ = _inputs(2, 5, 8, 4, with_h0=False)
    with pytest.raises(ValueError, match="A \\(8, 3\\)"):
        selective_scan(x, delta, A[:, :3], B, C, D)
    with pytest.raises(ValueError, match="initial state h0"):
        selective_scan(x, delta, A, B, C, D, torch.zeros(2, 4, 8))


CPP_ONLY = pytest.mark.skipif("cpp" not in IMPLS, reason="the C++ extension does not build here")


@CPP_ONLY
def test_kernel_sums_several_blocks_per_group_as_the_reference():
    """A batch large enough that the backward takes two or more channel blocks per group (their ∂B,
    ∂C lanes added up in the buffer before the lanes are summed): still the reference's gradients."""
    assert backward_groups(12, 72) == 2  # 5 blocks (the last one partial) in 2 groups
    _equal_to_reference(_inputs(12, 9, 72, 16, seed=3), "cpp", z=torch.randn(12, 9, 72),
                        delta_bias=torch.randn(72), delta_softplus=True)


@CPP_ONLY
@pytest.mark.parametrize("n", [16, 5])
def test_every_group_count_gives_the_same_gradients(n):
    """scan_backward's partial sums of ∂B, ∂C over 1 .. all groups of blocks (4 groups of 5 blocks:
    split unevenly) add up to the same gradients (to fp32 summation order); the other outputs are
    the same bits; a count out of range is refused by name."""
    di = 4 * torch.ops.attnlab_ssm.lanes() + 8  # 5 blocks of the build's width, the last one partial
    x, delta, A, B, C, D, h0 = _inputs(3, 11, di, n, seed=4)
    args = (x, delta, A.t().contiguous(), B, C, h0.transpose(1, 2).contiguous(), D, torch.randn(3, 11, di),
            torch.randn(di), True, torch.randn(3, 11, di), None)
    outs = {g: torch.ops.attnlab_ssm.scan_backward(*args, g) for g in (1, 2, 3, 4, 5)}  # 5 blocks
    for g, out in outs.items():
        assert out[3].shape == out[4].shape == (g, 3, 11, n)
        for i, (a, b) in enumerate(zip(out, outs[1])):
            if i in (3, 4):
                _close(a.sum(0), b.sum(0), f"output {i} with {g} groups")
            else:
                assert torch.equal(a, b), f"output {i} with {g} groups"
    for bad in (0, 6):
        with pytest.raises(RuntimeError, match="groups must be in 1 .. 5"):
            torch.ops.attnlab_ssm.scan_backward(*args, bad)


@CPP_ONLY
def test_gradients_are_the_same_bits_on_one_thread_and_two():
    args = _inputs(4, 20, 64, 16, seed=6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(_scan("cpp"), args)
        torch.set_num_threads(2)
        two = _run(_scan("cpp"), args)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip([one[0], one[1], *one[2]], [two[0], two[1], *two[2]]):
        assert (a is None and b is None) or torch.equal(a, b)


def test_backward_groups_cover_the_blocks_and_depend_on_the_shapes_only():
    assert [backward_groups(b, 256) for b in (1, 2, 12, 16, 64)] == [16, 8, 2, 1, 1]
    assert backward_groups(1, 20) == 2 and backward_groups(3, 8) == 1  # never more groups than blocks
    assert [backward_groups(b, 256, lanes=8) for b in (1, 12)] == [16, 2]  # the AVX2 build's 8-channel blocks
    assert backward_groups(1, 20, lanes=8) == 3
