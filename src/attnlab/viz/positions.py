"""positions: the sinusoidal encoding (heatmap, clocks, PE(p)·PE(p+k)) and rotary embeddings (RoPE).

Everything is computed by the model's own functions: nn/positional.sinusoidal_table and
nn/rope.RotaryEmbedding / apply_rope.
Shape legend: P positions, D model dim, Dh head dim, K offsets.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlab.nn.positional import sinusoidal_table
from attnlab.nn.rope import RotaryEmbedding, apply_rope
from attnlab.viz.figure import finish, new_figure


@dataclass
class PositionsResult:
    table: np.ndarray           # (P, D) sinusoidal PE, even dims sine, odd dims cosine
    clock_pairs: list[int]      # pair i = dimensions (2i, 2i+1)
    clock_positions: list[int]
    clock_angles: np.ndarray    # (pairs, positions) angle of (cos, sin) in radians, in [0, 2π)
    starts: list[int]           # p
    offsets: np.ndarray         # (K,) k
    dot: np.ndarray             # (len(starts), K) PE(p)·PE(p+k)
    rope_head_dim: int
    rope_theta: float
    rope_pairs: list[int]       # pair i = dimensions (i, i + Dh/2) (rotate-half layout)
    rope_points: np.ndarray     # (pairs, positions, 2) a unit vector in that pair, rotated to each position
    rope_gaps: list[int]        # m − n
    rope_m: np.ndarray          # (M,) query positions m
    rope_scores: np.ndarray     # (len(gaps), M) ⟨R_m q, R_n k⟩ with n = m − gap

    @property
    def pe_spread(self) -> float:
        """Largest difference of PE(p)·PE(p+k) between starts p, over every offset k."""
        return float(np.ptp(self.dot, axis=0).max())

    @property
    def rope_spread(self) -> float:
        """Largest change of the RoPE score along m, over every fixed m − n."""
        return float(np.ptp(self.rope_scores, axis=1).max())

    @property
    def caption(self) -> str:
        spread, flat = self.pe_spread, self.rope_spread
        return (f"Each dimension pair of the sinusoidal encoding is a clock hand turning at its own speed; "
                f"PE(p)·PE(p+k) is the same curve for every start p (largest gap {spread:.1e}), so "
                f"offsets are linear maps of the encoding; with RoPE the score of a rotated query and key "
                f"depends on m − n only (flat lines; largest change {flat:.1e}).")


def sinusoid_dots(table: torch.Tensor, starts: list[int], offsets: np.ndarray) -> np.ndarray:
    """(len(starts), K) PE(p)·PE(p + k) for every start p and offset k."""
    return np.array([[float(table[p] @ table[p + int(k)]) for k in offsets] for p in starts])


def rope_scores(head_dim: int, theta: float, gaps: list[int], m: np.ndarray, seed: int = 0) -> np.ndarray:
    """⟨R_m q, R_n k⟩ for a random q and k (seeded) and n = m − gap: (len(gaps), len(m))."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    rotary = RotaryEmbedding(head_dim, theta)
    out = []
    for gap in gaps:
        qm = apply_rope(q.expand(1, 1, len(m), head_dim), *rotary(torch.as_tensor(m)))  # (1, 1, M, Dh)
        kn = apply_rope(k.expand(1, 1, len(m), head_dim), *rotary(torch.as_tensor(m - gap)))
        out.append((qm * kn).sum(-1)[0, 0].numpy())
    return np.stack(out)


def positions_figure_data(d_model: int = 128, max_len: int = 100, head_dim: int = 64, theta: float = 10000.0
                          ) -> PositionsResult:
    """The numbers of the positions figure."""
    table = sinusoidal_table(max_len, d_model)
    pairs = [0, 1, 3, 8]
    clock_positions = list(range(8))
    angles = np.array([[np.arctan2(float(table[p, 2 * i]), float(table[p, 2 * i + 1])) % (2 * np.pi)
                        for p in clock_positions] for i in pairs])
    starts = [0, 10, 25, 40]
    offsets = np.arange(0, max_len - max(starts))
    rotary = RotaryEmbedding(head_dim, theta)
    rope_pairs = [0, 6]
    steps = torch.arange(8)
    cos, sin = rotary(steps)  # (1, 1, 8, Dh)
    points = []
    for i in rope_pairs:
        unit = torch.zeros(1, 1, len(steps), head_dim)
        unit[..., i] = 1.0
        rotated = apply_rope(unit, cos, sin)[0, 0]  # (8, Dh)
        points.append(torch.stack([rotated[:, i], rotated[:, i + head_dim // 2]], dim=-1).numpy())
    gaps = [0, 3, 10]
    m = np.arange(max(gaps), max(gaps) + 200)
    return PositionsResult(table.numpy(), pairs, clock_positions, angles, starts, offsets,
                           sinusoid_dots(table, starts, offsets), head_dim, theta, rope_pairs, np.stack(points),
                           gaps, m, rope_scores(head_dim, theta, gaps, m))


def draw_positions(r: PositionsResult, out) -> None:
    fig = new_figure(14, 8.2)
    top, bottom = fig.subfigures(2, 1)
    heat, clocks = top.subfigures(1, 2, width_ratios=[1.25, 1])
    ax = heat.subplots()
    image = ax.imshow(r.table, cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
    ax.set_xlabel("dimension (even: sine, odd: cosine)")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal encoding, d_model {r.table.shape[1]}", fontsize=9)
    heat.colorbar(image, ax=ax, shrink=0.8)
    cax = clocks.subplots(1, len(r.clock_pairs))
    colors = _colors(len(r.clock_positions))
    for ax, i, angles in zip(cax, r.clock_pairs, r.clock_angles):
        ax.add_patch(_circle())
        for p, a, c in zip(r.clock_positions, angles, colors):
            ax.plot([0, np.cos(a)], [0, np.sin(a)], color=c, lw=1.6)
            ax.text(1.18 * np.cos(a), 1.18 * np.sin(a), str(p), color=c, fontsize=7, ha="center", va="center")
        ax.set_title(f"dims {2 * i},{2 * i + 1}", fontsize=8)
        _square(ax)
    clocks.suptitle("clocks: hand of (cos, sin) of a pair at positions 0-7", fontsize=9)
    bx, rx, sx = bottom.subplots(1, 3)
    for p, row in zip(r.starts, r.dot):
        bx.plot(r.offsets, row, lw=3 if p == r.starts[0] else 1.2, label=f"p = {p}",
                ls="-" if p == r.starts[0] else "--")
    bx.set_xlabel("offset k")
    bx.set_ylabel("PE(p) · PE(p + k)")
    bx.set_title("similarity depends on k only", fontsize=9)
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    rx.add_patch(_circle())
    for pair, pts, marker in zip(r.rope_pairs, r.rope_points, "os"):
        label = f"pair {pair} (dims {pair}, {pair + r.rope_head_dim // 2})"
        rx.plot(pts[:, 0], pts[:, 1], marker=marker, lw=0.8, label=label)
        for m, (x, y) in enumerate(pts):
            rx.annotate(str(m), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
    _square(rx)
    rx.set_title("RoPE: a 2-D pair rotated at positions 0-7", fontsize=9)
    rx.legend(fontsize=7, loc="lower left")
    for gap, row in zip(r.rope_gaps, r.rope_scores):
        sx.plot(r.rope_m, row, label=f"m − n = {gap}")
    sx.set_xlabel("query position m")
    sx.set_ylabel("⟨R_m q, R_n k⟩")
    sx.set_title(f"RoPE score for fixed m − n (Dh {r.rope_head_dim}, θ {r.rope_theta:g})", fontsize=9)
    sx.legend(fontsize=7)
    sx.grid(alpha=0.3)
    finish(fig, "Positions: sinusoidal encoding and rotary embeddings", r.caption, out)


def _colors(n: int):
    from matplotlib import colormaps  # optional heavy dependency (viz extra)

    return [colormaps["viridis"](i / max(1, n - 1)) for i in range(n)]


def _circle():
    from matplotlib.patches import Circle  # optional heavy dependency (viz extra)

    return Circle((0, 0), 1.0, fill=False, color="#999999", lw=0.8)


def _square(ax) -> None:
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
