"""What every figure shares: a matplotlib Figure (no pyplot, no GUI backend), a title, a one-sentence
caption under it, and a small PNG (dpi 100)."""
from __future__ import annotations

from pathlib import Path

DPI = 100


def new_figure(width: float, height: float):
    """A matplotlib Figure of width × height inches.

    Raises:
        ImportError: matplotlib is not installed (the `viz` extra: pip install 'attnlab[viz]').
    """
    from matplotlib.figure import Figure  # optional heavy dependency (viz extra)

    return Figure(figsize=(width, height), layout="constrained")


def finish(fig, title: str, caption: str, out: str | Path) -> Path:
    """Add the title and the caption (wrapped under the plots) and write the figure to `out`."""
    fig.suptitle(title, fontsize=12, fontweight="bold")
    width_chars = int(fig.get_figwidth() * 14)
    fig.supxlabel(_wrap(caption, width_chars), fontsize=9, style="italic", color="#333333")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    if out.suffix.lower() == ".png":
        shrink_png(out)
    return out


def shrink_png(path: str | Path) -> None:
    """Rewrite a PNG with an adaptive 256-colour palette (figures have few colours): about 3× smaller."""
    from PIL import Image  # optional heavy dependency (viz extra: matplotlib brings Pillow)

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join(lines + [line])


def short(token: str, limit: int = 12) -> str:
    """A token label for an axis: visible spaces (␣), newlines as ↵, cut to `limit` characters."""
    text = token.replace(" ", "␣").replace("\n", "↵").replace("Ġ", "␣")
    return text if len(text) <= limit else text[:limit - 1] + "…"
