"""The Mamba block (the selective-SSM mixer), its pre-norm residual layer, and its recurrent state.

Shape legend: B batch, T new tokens, D model dim, Di inner width (expand · D), N state size
(d_state), K convolution width (d_conv), R rank of the Δ projection (dt_rank).

    x, z = in_proj(u)                        (B, T, Di) each
    x = SiLU(causal depthwise conv1d(x))     kernel K, one filter per channel
    Δ, B, C = x_proj(x)                      (B, T, R), (B, T, N), (B, T, N)
    Δ = softplus(dt_proj(Δ))                 (B, T, Di), dt_proj's bias initialised so Δ ∈ [dt_min, dt_max]
    y = selective_scan(x, Δ, A = −exp(A_log), B, C, D)
    out = out_proj(y ⊙ SiLU(z))

Under CPU bf16 autocast, x_proj, dt_proj and the scan run in fp32 (nn/cpu_autocast.py): the scan
reads Δ, B and C in fp32, and bf16 products that small cost more in casts than they save.

Source: Gu & Dao 2023, "Mamba", §3.4 and Figure 3 (the block), Algorithm 2 (the selective SSM),
§3.6 and the reference implementation state-spaces/mamba (mamba_simple.py) for the initialisation:
A = 1..N per channel (S4D-Real), D = 1, dt_proj bias = softplus⁻¹(Δ₀) with Δ₀ log-uniform in
[dt_min, dt_max], dt_proj weight uniform ±dt_scale / √R.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.causal_conv import causal_conv1d_silu
from attnlab.nn.cpu_autocast import fp32_under_cpu_autocast
from attnlab.nn.norm import RMSNorm
from attnlab.nn.ssm import selective_scan, selective_step


class MambaState:
    """The recurrent state of one Mamba block for B sequences: constant size, whatever the position.

    conv: (B, Di, K) the last K inputs of the convolution (oldest first); ssm: (B, Di, N) h_t.
    `length` counts the positions fed so far (padding included).
    """

    def __init__(self, batch_size: int, d_inner: int, d_conv: int, d_state: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self.conv = torch.zeros(batch_size, d_inner, d_conv, dtype=dtype, device=device)  # (B, Di, K)
        self.ssm = torch.zeros(batch_size, d_inner, d_state, dtype=dtype, device=device)  # (B, Di, N)
        self.length = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (B',) int64, e.g. the surviving hypotheses of beam search."""
        self.conv = self.conv.index_select(0, index)
        self.ssm = self.ssm.index_select(0, index)

    def memory_bytes(self) -> int:
        """Bytes held by the state tensors."""
        return self.conv.numel() * self.conv.element_size() + self.ssm.numel() * self.ssm.element_size()


class MambaBlock(nn.Module):
    """The Mamba mixer: gated selective SSM between an input and an output projection.

    Args (keyword-only):
        d_model: D. d_state: N. d_conv: K. expand: Di = expand · D. dt_rank: R.
        dt_min, dt_max, dt_init_floor, dt_scale, dt_init ("random" | "constant"): the initialisation
            of Δ (module docstring). conv_bias: bias on the convolution. bias: biases on in_proj/out_proj.
    """

    def __init__(self, *, d_model: int, d_state: int, d_conv: int, expand: int, dt_rank: int,
                 dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4, dt_scale: float = 1.0,
                 dt_init: str = "random", conv_bias: bool = True, bias: bool = False):
        super().__init__()
        d_inner = expand * d_model
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = d_inner, d_state, d_conv, dt_rank
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=bias)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1, bias=conv_bias)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(d_inner, d_state))
        self.D = nn.Parameter(torch.empty(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)
        self.A_log._no_weight_decay = True  # as the reference: A and D are not decayed
        self.D._no_weight_decay = True
        self.reset_ssm_parameters(dt_min, dt_max, dt_init_floor, dt_scale, dt_init)

    @torch.no_grad()
    def reset_ssm_parameters(self, dt_min: float, dt_max: float, dt_init_floor: float, dt_scale: float,
                             dt_init: str) -> None:
        """S4D-Real A, D = 1, and the Δ projection of the reference implementation (module docstring)."""
        A = torch.arange(1, self.d_state + 1, dtype=torch.float32).expand(self.d_inner, -1)  # (Di, N)
        self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)
        std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            self.dt_proj.weight.fill_(std)
        else:
            self.dt_proj.weight.uniform_(-std, std)
        log_lo, log_hi = math.log(dt_min), math.log(dt_max)
        dt = torch.exp(torch.rand(self.d_inner) * (log_hi - log_lo) + log_lo).clamp(min=dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ₀)

    def _conv(self, x: torch.Tensor, state: MambaState | None) -> torch.Tensor:
        """Causal depthwise convolution over time. x: (B, Di, T) -> (B, Di, T), before SiLU."""
        w, k = self.conv1d.weight, self.d_conv  # w: (Di, 1, K)
        if state is None:
            full = F.pad(x, (k - 1, 0))                                        # (B, Di, K − 1 + T)
        else:
            full = torch.cat([state.conv[:, :, 1:].to(x.dtype), x], dim=-1)   # (B, Di, K − 1 + T)
            state.conv.copy_(full[:, :, -k:])
        return F.conv1d(full, w, self.conv1d.bias, groups=self.d_inner)

    def forward(self, u: torch.Tensor, mask: torch.Tensor | None = None, state: MambaState | None = None
                ) -> torch.Tensor:
        """Args:
            u: (B, T, D) input (already normalised by the layer).
            mask: (B, T) bool/int, 1 = real token, 0 = padding; None = no padding. A padded position
                feeds zeros to the convolution and has Δ = 0, so the SSM state passes it unchanged:
                left padding (generate's) gives exactly what each sequence gives alone.
            state: the recurrent state to continue from and update in place (prefill or decoding);
                None = start from zeros and keep nothing (training, evaluation).
        Returns:
            (B, T, D) in u's dtype.
        Source: Gu & Dao 2023, §3.4, Figure 3; Algorithm 2.
        """
        b, t, _ = u.shape
        x, z = self.in_proj(u).chunk(2, dim=-1)                                # (B, T, Di) each
        keep = None if mask is None else mask[:, :, None].to(x.dtype)          # (B, T, 1)
        if keep is not None:
            x = x * keep
        if state is None and keep is None:  # training, evaluation: the fused kernel where it builds
            x = causal_conv1d_silu(x, self.conv1d.weight, self.conv1d.bias)        # (B, T, Di)
        else:
            x = F.silu(self._conv(x.transpose(1, 2), state)).transpose(1, 2)   # (B, T, Di)
        if keep is not None:
            x = x * keep
        with fp32_under_cpu_autocast(x) as cast:  # x_proj, dt_proj and the scan in fp32 (nn/cpu_autocast.py)
            x, z = cast(x), cast(z)
            dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
            A = -torch.exp(self.A_log.float())                                 # (Di, N)
            if state is not None and t == 1:  # decoding: one step of the recurrence
                delta = F.softplus(self.dt_proj(dt))                           # (B, 1, Di)
                if keep is not None:
                    delta = delta * keep
                y = selective_step(x[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], self.D, state.ssm)[:, None]
                y = y * F.silu(z)                                              # (B, 1, Di)
            else:  # the scan, with Δ = softplus(dt_proj(dt)), the skip D and the gate SiLU(z) fused into it
                if keep is None:
                    delta, bias, softplus = F.linear(dt, self.dt_proj.weight), self.dt_proj.bias, True
                else:  # padding: Δ = 0 there, set after the softplus
                    delta, bias, softplus = F.softplus(self.dt_proj(dt)) * keep, None, False
                y, h_last = selective_scan(x, delta, A, B, C, self.D, None if state is None else state.ssm, z=z,
                                           delta_bias=bias, delta_softplus=softplus)
                if state is not None:
                    state.ssm.copy_(h_last)
        if state is not None:
            state.length += t
        return self.out_proj(y)


class MambaLayer(nn.Module):
    """x + MambaBlock(RMSNorm(x)): one pre-norm residual layer of the Mamba stack.

    Args (keyword-only): norm_eps, residual_in_fp32 (carry the residual stream in fp32 when the
    parameters are bf16/fp16, as the reference does), and MambaBlock's arguments.
    """

    def __init__(self, *, d_model: int, norm_eps: float = 1e-5, residual_in_fp32: bool = True, **block):
        super().__init__()
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.mixer = MambaBlock(d_model=d_model, **block)
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, state: MambaState | None = None
                ) -> torch.Tensor:
        """(B, T, D) -> (B, T, D) (fp32 with residual_in_fp32); mask and state as MambaBlock."""
        h = self.mixer(self.norm(x.to(self.norm.weight.dtype)), mask, state)
        residual = x.float() if self.residual_in_fp32 else x
        return residual + h
