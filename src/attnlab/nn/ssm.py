"""The selective scan of Mamba: a linear recurrence whose discretisation depends on the input.

Shape legend: B batch, T length, Di inner width (D_inner = expand · d_model, the channels the scan
runs over, each independently), N state size (d_state).

For every channel d and state index n, with the zero-order hold (ZOH) of eq. (4) for Ā and the
simpler Euler step the paper's code uses for B̄ (§3.5.2 / Algorithm 2):

    Ā_t = exp(Δ_t A)           (B, Di, N)    A < 0, so 0 < Ā_t ≤ 1
    B̄_t x_t ≈ Δ_t B_t x_t       (B, Di, N)
    h_t = Ā_t ⊙ h_{t−1} + B̄_t x_t
    y_t = C_t · h_t + D ⊙ x_t   (B, Di)        the contraction is over N

Around the recurrence, the Mamba block's maps can be fused into the scan (the reference
implementation's selective_scan_fn): Δ = softplus(delta + delta_bias) before it, y ⊙ SiLU(z) after.

Three implementations compute the same numbers (tests hold them to 1e-5 in fp32, gradients too):

- selective_scan_ref: the recurrence as written, one step at a time, differentiated by autograd.
  Readable; its backward is slow for long T.
- selective_scan, impl "cpp" (the default where the C++ extension builds: x86-64 with AVX512, or
  AVX2): ssm_scan.cpp keeps the N states of a block of channels (16 with AVX512, 8 with AVX2:
  nn/lanes.h) as vectors in registers for the whole sequence, so no (B, T, Di, N) tensor is ever written; the backward recomputes the states in
  segments of 128 steps and runs the adjoint recurrence (g_{h,t} = C_t ⊗ g_{y,t} + Ā_{t+1} ⊙
  g_{h,t+1}) in registers too (the paper's §3.3.2 design, on a CPU's vector registers in place of
  a GPU's SRAM). ∂B_t and ∂C_t, sums over the channels, are added up over a group of channel
  blocks as vectors and summed over their lanes once per group (backward_groups).
  Forward + backward with one thread at B 12, Di 256, N 16 (bench/ssm_scan.py) it
  is about 4× the PyTorch loop below at T = 64 and 256.
- selective_scan, impl "torch" (the fallback): the loop inside a torch.autograd.Function whose
  backward runs the adjoint recurrence by hand, with every tensor of one step (B × N × Di) small
  enough to stay in cache.
The parallel forms were measured and are slower on a CPU, where the B · Di · N independent lanes
already fill the vector units and the cost is memory traffic, not the sequential dependence:
a chunked scan (sequential across chunks of 16, a cumsum of log-decays within them, which also
overflows e^{−S} once a chunk decays past e^{−88}) and a log-depth (Hillis–Steele) associative
scan over (B, T, Di, N) tensors run 13× and 30× slower than the C++ kernel at T = 64 (18× and
73× at T = 256). Mamba-1's A is diagonal per channel and state, so Mamba-2's state-space duality
(a scalar decay per head, whose chunks become matrix products) does not apply exactly.

selective_step is one decoding step (T = 1) on a state held by the caller.

Source: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
Algorithm 2 (the selective SSM), §3.4 (the Mamba block), eq. (4) (ZOH discretisation); the reference
implementation (state-spaces/mamba, selective_scan_ref) for B̄ ≈ ΔB.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.nn import quant_kernel  # the one C++ extension, built at first use


def _check(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
           h0: torch.Tensor | None) -> None:
    b, t, di = x.shape
    n = A.shape[-1]
    if delta.shape != x.shape or A.shape != (di, n) or B.shape != (b, t, n) or C.shape != (b, t, n):
        raise UserError(f"selective scan shapes disagree: x {tuple(x.shape)}, delta {tuple(delta.shape)}, "
                        f"A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)} (want (B, T, Di), "
                        f"(B, T, Di), (Di, N), (B, T, N), (B, T, N))")
    if h0 is not None and h0.shape != (b, di, n):
        raise UserError(f"initial state h0 is {tuple(h0.shape)}, want (B, Di, N) = {(b, di, n)}")


def _delta(delta: torch.Tensor, delta_bias: torch.Tensor | None, delta_softplus: bool) -> torch.Tensor:
    """Δ in fp32: softplus(delta + delta_bias) or delta (+ delta_bias)."""
    dt = delta.float() if delta_bias is None else delta.float() + delta_bias.float()
    return F.softplus(dt) if delta_softplus else dt


def _gate(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """(y + D ⊙ x) ⊙ SiLU(z), in fp32, the maps after the scan (either left out when None)."""
    if D is not None:
        y = y + D.float() * x.float()
    return y if z is None else y * F.silu(z.float())


def selective_scan_ref(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       D: torch.Tensor | None = None, h0: torch.Tensor | None = None, z: torch.Tensor | None = None,
                       delta_bias: torch.Tensor | None = None, delta_softplus: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scan, sequentially: the recurrence of the module docstring, step by step.

    Args:
        x: (B, T, Di) input. delta: (B, T, Di) step sizes Δ > 0 (after softplus; or before it, with
            delta_softplus); Δ = 0 leaves the state unchanged (Ā = 1, B̄ = 0), which is how padding
            is skipped.
        A: (Di, N) negative real state matrix (diagonal per channel). B, C: (B, T, N) input-dependent.
        D: (Di,) skip, or None. h0: (B, Di, N) initial state, or None for zeros.
        z: (B, T, Di) gate: the output is multiplied by SiLU(z) (the Mamba block's y ⊙ SiLU(z)); None = no gate.
        delta_bias: (Di,) added to delta first (dt_proj's bias), or None. delta_softplus: Δ =
            softplus(delta + delta_bias) (the block's Δ).
    Returns:
        (y (B, T, Di) in x's dtype, h_T (B, Di, N) fp32 final state). Computes in fp32.
    Raises:
        UserError: when the shapes disagree.
    Source: Gu & Dao 2023, Algorithm 2 and eq. (4); the reference implementation's selective_scan_ref
        for z, delta_bias and delta_softplus.
    """
    _check(x, delta, A, B, C, h0)
    b, t, di = x.shape
    xf, dt, Af, Bf, Cf = x.float(), _delta(delta, delta_bias, delta_softplus), A.float(), B.float(), C.float()
    h = xf.new_zeros(b, di, A.shape[-1]) if h0 is None else h0.float()  # (B, Di, N)
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i, :, None] * Af)                                # Ā_t (B, Di, N)
        drive = (dt[:, i] * xf[:, i])[:, :, None] * Bf[:, i, None, :]           # B̄_t x_t (B, Di, N)
        h = decay * h + drive
        ys.append((h * Cf[:, i, None, :]).sum(-1))                               # C_t h_t (B, Di)
    y = torch.stack(ys, dim=1) if ys else xf.new_zeros(b, 0, di)                 # (B, T, Di)
    return _gate(y, xf, D, z).to(x.dtype), h


def _scan_loop(x: torch.Tensor, dt: torch.Tensor, At: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               h0: torch.Tensor, keep_states: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Forward recurrence in the time-major layout. x, dt: (T, B, Di); At: (N, Di); B, C: (T, B, N);
    h0: (B, N, Di). Returns (y (T, B, Di), h_T (B, N, Di), every state (T + 1, B, N, Di) or None)."""
    t_len, b, di = x.shape
    n = At.shape[0]
    drive_x = (dt * x).unsqueeze(2)                   # Δx (T, B, 1, Di)
    dt_rows = dt.unsqueeze(2)                         # (T, B, 1, Di)
    B_cols = B.unsqueeze(-1)                          # (T, B, N, 1)
    decay = torch.empty_like(h0)                      # Ā_t (B, N, Di)
    if keep_states:
        hs = torch.empty((t_len + 1, b, n, di), dtype=h0.dtype, device=h0.device)
        hs[0] = h0
        for i in range(t_len):
            torch.mul(dt_rows[i], At, out=decay).exp_()
            torch.mul(decay, hs[i], out=hs[i + 1]).baddbmm_(B_cols[i], drive_x[i])  # Ā h + B ⊗ Δx
        y = torch.bmm(C.reshape(t_len * b, 1, n), hs[1:].view(t_len * b, n, di))  # (T·B, 1, Di)
        return y.view(t_len, b, di), hs[t_len], hs
    h, y = h0.clone(), x.new_empty(t_len, b, di)
    C_rows = C.unsqueeze(2)                           # (T, B, 1, N)
    for i in range(t_len):
        torch.mul(dt_rows[i], At, out=decay).exp_()
        h.mul_(decay).baddbmm_(B_cols[i], drive_x[i])  # Ā h + B ⊗ Δx, in place
        torch.bmm(C_rows[i], h, out=y[i].unsqueeze(1))  # (B, 1, Di)
    return y, h, None


class _SelectiveScan(torch.autograd.Function):
    """y, h_T = scan(x, Δ, Aᵀ, B, C, h0) in the time-major layout of _scan_loop, with a hand-written
    backward: the adjoint recurrence run from T − 1 down to 0, one step's tensors at a time.

    Steps t = 0 .. T − 1; h_{−1} = h0 is the initial state and h_{T−1} the final one. With
    g_h,t = ∂L/∂h_t (B, N, Di), starting from ∂L/∂(final state):
        g_h,t    += C_t ⊗ g_y,t                     then, going back, g_h,t−1 = Ā_t ⊙ g_h,t
        ∂L/∂(Δ_t A) = g_h,t ⊙ h_{t−1} ⊙ Ā_t         (the log-decay)
        ∂A  = Σ_{t,b} Δ_t ⊙ ∂L/∂(Δ_t A)             ∂Δ_t = Σ_n A ⊙ ∂L/∂(Δ_t A) + x_t ⊙ Σ_n B_t g_h,t
        ∂x_t = Δ_t ⊙ Σ_n B_t g_h,t                  ∂B_t = Σ_d g_h,t (Δ_t x_t)     ∂C_t = Σ_d h_t g_y,t
        ∂h0 = Ā_0 ⊙ g_h,0, what g_h holds after the last step back.
    """

    @staticmethod
    def forward(ctx, x, dt, At, B, C, h0):
        y, h_last, hs = _scan_loop(x, dt, At, B, C, h0, keep_states=True)
        ctx.save_for_backward(x, dt, At, B, C, hs)
        return y, h_last.clone()

    @staticmethod
    def backward(ctx, g_y, g_last):
        x, dt, At, B, C, hs = ctx.saved_tensors
        t_len, b, di = x.shape
        n = At.shape[0]
        g_y = g_y.contiguous()
        g_drive, g_dtA, g_B = torch.empty_like(x), torch.empty_like(dt), torch.empty_like(B)  # (T, B, ·)
        g_C = torch.bmm(hs[1:].view(t_len * b, n, di), g_y.view(t_len * b, di, 1)).view(t_len, b, n)
        g_At = torch.zeros_like(hs[0])                 # summed over the batch at the end (B, N, Di)
        g_h = torch.zeros_like(hs[0]) if g_last is None else g_last.clone()  # ∂L/∂h_t (B, N, Di)
        decay, g_log = torch.empty_like(g_h), torch.empty_like(g_h)
        drive_x = dt * x                               # Δx (T, B, Di)
        for i in range(t_len - 1, -1, -1):
            g_h.baddbmm_(C[i].unsqueeze(-1), g_y[i].unsqueeze(1))                   # += C_t ⊗ g_y,t
            torch.mul(dt[i].unsqueeze(1), At, out=decay).exp_()                     # Ā_t (B, N, Di)
            torch.mul(g_h, hs[i], out=g_log).mul_(decay)                            # ∂L/∂(Δ_t A) (B, N, Di)
            g_At.addcmul_(g_log, dt[i].unsqueeze(1))
            torch.bmm(B[i].unsqueeze(1), g_h, out=g_drive[i].unsqueeze(1))         # ∂L/∂(Δx) (B, 1, Di)
            torch.bmm(g_h, drive_x[i].unsqueeze(-1), out=g_B[i].unsqueeze(-1))     # (B, N, 1)
            torch.sum(g_log.mul_(At), 1, out=g_dtA[i])                              # Σ_n ∂L/∂(ΔA) · A (B, Di)
            g_h.mul_(decay)                                                         # on to h_{t−1}
        return g_drive * dt, torch.addcmul(g_dtA, g_drive, x), g_At.sum(0), g_B, g_C, g_h


class _ScanKernel(torch.autograd.Function):
    """y, h_T = scan(x, Δ, Aᵀ, B, C, h0, D, z, delta_bias, softplus) by the C++ kernels (ssm_scan.cpp):
    x, Δ, z (B, T, Di); Aᵀ (N, Di); B, C (B, T, N); h0 (B, N, Di); D, delta_bias (Di,); h0, D, z and
    delta_bias optional. The backward recomputes the states from h0 (nothing of size T · N · Di is
    kept) and runs the adjoint recurrence of _SelectiveScan through the fused maps; the kernel
    returns ∂A, ∂D and ∂delta_bias as partial sums per sequence, and ∂B, ∂C per (group of channel
    blocks, sequence) (backward_groups), that are added here."""

    @staticmethod
    def forward(ctx, x, dt, At, B, C, h0, D, z, bias, softplus):
        y, last = torch.ops.attnlab_ssm.scan_forward(x, dt, At, B, C, h0, D, z, bias, softplus)
        ctx.save_for_backward(x, dt, At, B, C, h0, D, z, bias)
        ctx.softplus = softplus
        return y, last

    @staticmethod
    def backward(ctx, g_y, g_last):
        x, dt, At, B, C, h0, D, z, bias = ctx.saved_tensors
        g_last = None if g_last is None else g_last.contiguous()
        gx, gdt, gA, gB, gC, gh0, gD, gz, gbias = torch.ops.attnlab_ssm.scan_backward(
            x, dt, At, B, C, h0, D, z, bias, ctx.softplus, g_y.contiguous(), g_last,
            backward_groups(x.shape[0], x.shape[2], _BUILD["lanes"]))
        return (gx, gdt, gA.sum(0), gB.sum(0), gC.sum(0), None if h0 is None else gh0,
                None if D is None else gD.sum(0), None if z is None else gz, None if bias is None else gbias.sum(0),
                None)


def _fake_forward(x, dt, At, B, C, h0, D, z, bias, softplus):
    return torch.empty_like(x), x.new_empty(x.shape[0], At.shape[0], x.shape[2])


def backward_groups(batch: int, d_inner: int, lanes: int = 16) -> int:
    """How many groups the scan's backward takes each sequence's Di / lanes channel blocks in (1 ..
    blocks; lanes: the build's channels per block, torch.ops.attnlab_ssm.lanes(), 16 with AVX512 and 8
    with AVX2): enough that batch · groups ≥ 16 units of work for the threads, and no more, since each
    group sums its ∂B, ∂C lanes on its own (ssm_scan.cpp). A function of the shapes only, so the
    sums' order, and the bits, do not depend on the thread count."""
    return max(1, min(-(-d_inner // lanes), -(-16 // batch)))


def _fake_backward(x, dt, At, B, C, h0, D, z, bias, softplus, g_y, g_last, groups):
    b, t, di = x.shape
    n = At.shape[0]
    per_b = lambda v: x.new_empty(b, di) if v is not None else x.new_empty(0)  # noqa: E731
    return [torch.empty_like(x), torch.empty_like(x), x.new_empty(b, n, di), x.new_empty(groups, b, t, n),
            x.new_empty(groups, b, t, n), x.new_empty(b, n, di), per_b(D),
            torch.empty_like(x) if z is not None else x.new_empty(0), per_b(bias)]


_BUILD = {"lanes": 16}  # the loaded extension's channels per block (ssm_scan.cpp lanes(): 16 AVX512, 8 AVX2)


def _register_fakes() -> None:
    """Shapes of the kernels' outputs, for torch.compile, and the build's block width (run once the
    extension has loaded)."""
    _BUILD["lanes"] = torch.ops.attnlab_ssm.lanes()
    torch.library.register_fake("attnlab_ssm::scan_forward")(_fake_forward)
    torch.library.register_fake("attnlab_ssm::scan_backward")(_fake_backward)


quant_kernel.ON_LOAD.append(_register_fakes)
IMPLS = ("cpp", "torch")


def selective_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, h0: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False, impl: str | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scan, fast on CPU: same arguments, results and errors as selective_scan_ref.

    Two implementations (module docstring): "cpp", the C++ kernels of ssm_scan.cpp (the one C++
    extension, nn/quant_kernel.py: x86-64 with AVX512 or AVX2), which keep every state in registers, fuse
    Δ's bias and softplus, the skip D and the gate z, and recompute the states in the backward pass
    (memory O(B·T·Di + B·N·Di)); "torch", the step loop on (B, N, Di) tensors with a hand-written
    backward and the maps as PyTorch ops (the fallback where the extension does not build), which
    without gradients keeps no per-step state and with gradients keeps every state,
    (T + 1)·B·N·Di floats.

    Args / Returns / Raises: as selective_scan_ref; impl: "cpp", "torch", or None = the best available.
    Raises:
        UserError: also for an unknown impl, or "cpp" where the extension is not available.
    Source: Gu & Dao 2023, Algorithm 2 and eq. (4); §3.3.2 (recomputation in the backward pass).
    """
    _check(x, delta, A, B, C, h0)
    if impl not in (None, *IMPLS):
        raise UserError(f"impl must be one of {', '.join(IMPLS)} or None, got {impl!r}", param="impl")
    cpp = x.device.type == "cpu" and quant_kernel.kernel() == "cpp"
    if impl == "cpp" and not cpp:
        raise UserError("impl 'cpp': the C++ extension is not available here (nn/quant_kernel.py says why)",
                        param="impl")
    if cpp and impl != "torch":
        f32 = lambda v: None if v is None else v.float().contiguous()  # noqa: E731
        y, h_last = _ScanKernel.apply(f32(x), f32(delta), A.float().t().contiguous(), f32(B), f32(C),
                                      None if h0 is None else h0.float().transpose(1, 2).contiguous(),
                                      f32(D), f32(z), f32(delta_bias), delta_softplus)
    else:
        y, h_last = _torch_scan(x, _delta(delta, delta_bias, delta_softplus), A, B, C, h0)
        y = _gate(y, x, D, z)
    return y.to(x.dtype), h_last.transpose(1, 2)                                         # (B, Di, N)


@torch.autocast("cpu", enabled=False)  # fp32 throughout, also under bf16 autocast (its bmm would be bf16)
def _torch_scan(x, delta, A, B, C, h0):
    """The PyTorch loop (_scan_loop / _SelectiveScan) on Δ: y (B, T, Di) and h_T (B, N, Di), fp32."""
    b, t, di = x.shape
    n = A.shape[-1]
    xt, dtt, Bt, Ct = (v.float().transpose(0, 1).contiguous() for v in (x, delta, B, C))  # (T, B, ·)
    At = A.float().t().contiguous()                                                      # (N, Di)
    h = x.new_zeros(b, n, di, dtype=torch.float32) if h0 is None else h0.float().transpose(1, 2).contiguous()
    inputs = (xt, dtt, At, Bt, Ct, h)                                                    # h: (B, N, Di)
    if torch.is_grad_enabled() and any(v.requires_grad for v in inputs):
        y, h_last = _SelectiveScan.apply(*inputs)
    else:
        y, h_last, _ = _scan_loop(*inputs, keep_states=False)
    return y.transpose(0, 1), h_last                                                     # (B, T, Di)


def selective_step(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    """One step of the recurrence for decoding, updating the state in place.

    Args:
        x, delta: (B, Di). A: (Di, N). B, C: (B, N). D: (Di,) or None.
        h: (B, Di, N) state h_{t−1}, overwritten with h_t (in its own dtype; the step computes in fp32).
    Returns:
        y_t (B, Di) in x's dtype.
    Source: Gu & Dao 2023, Algorithm 2 (one time step); eq. (4).
    """
    xf, dt = x.float(), delta.float()
    decay = torch.exp(dt[:, :, None] * A.float())                       # Ā_t (B, Di, N)
    drive = (dt * xf)[:, :, None] * B.float()[:, None, :]               # B̄_t x_t (B, Di, N)
    new = decay * h.float() + drive
    h.copy_(new)
    y = torch.bmm(new, C.float()[:, :, None]).squeeze(-1)               # (B, Di)
    if D is not None:
        y = y + D.float() * xf
    return y.to(x.dtype)
