"""`attnlab viz all`: every figure the installed models and the given runs allow, and DIR/index.html,
a self-contained gallery page (relative links only) with each figure, its caption and its command.

A figure that cannot be made is skipped with one line saying what is missing and how to get it.
"""
from __future__ import annotations

import html
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import UserError
from attnlab.viz import attention, attention_html, bpe, complexity, context, kv_cache, masks, moe, positions
from attnlab.viz import schedule, sources, teacher_forcing, training
from attnlab.tasks.kinds import Kind

SENTENCE, TRANSLATE = attention.EXAMPLE, attention.CROSS_EXAMPLE
QUICK_LENGTHS = (128, 256, 512, 1024, 2048)   # complexity in `all`: seconds, not minutes
QUICK_POSITIONS = (8, 64, 128, 256)           # kv-cache in `all`


class Skip(Exception):
    """A figure that cannot be made here; the message says what is missing and how to get it."""


@dataclass
class Made:
    name: str                 # the PNG's file name in the gallery folder
    title: str
    caption: str
    command: str              # the attnlab command that draws it alone
    page: str | None = None   # an interactive page beside it


@dataclass
class Gallery:
    figures: list[Made] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Context:
    """The output folder, the runs by kind, and each model loaded once."""

    def __init__(self, out: Path, runs: list[Path]):
        self.out, self.runs, self._models = out, runs, {}
        self.kinds = {}
        for run in runs:
            try:
                self.kinds[run] = sources.task_of(str(run)).kind
            except (FileNotFoundError, ValueError) as err:
                print(f"viz all: ignoring {run}: {err}", file=sys.stderr)

    def model(self, name: str, kinds=sources.DRAWN) -> sources.Source:
        if name not in self._models:
            try:
                self._models[name] = sources.load(name, kinds)
            except FileNotFoundError as err:
                raise Skip(str(err)) from None
        return self._models[name]

    def run(self, kind: Kind, moe_only: bool = False) -> Path:
        for run, k in self.kinds.items():
            if k == kind and (not moe_only or sources.run_config(run).get("model", {}).get("n_experts", 0)):
                return run
        if moe_only:
            raise Skip(f"no mixture-of-experts run among the runs; make {moe.MOE_RUN}")
        raise Skip("no translation run among the runs; make one with: attnlab train --recipe multi30k-en-de "
                   "--out runs/multi30k")


def find_runs(root: str | Path = "runs") -> list[Path]:
    """The run directories (holding a config.json) directly under `root`."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def _attention(ctx: _Context, model: str, name: str, page: bool) -> Made:
    maps = attention.attention_maps(ctx.model(model), SENTENCE)
    index = attention.find_token(maps.query_tokens, "it")
    layer, head = attention.head_for(maps, index, attention.find_token(maps.key_tokens, "animal"))
    cap = attention.caption(maps, index, layer, head)
    attention.draw_attention(maps, index, layer, head, ctx.out / f"{name}.png")
    html_name = f"{name}.html" if page else None
    if page:
        attention_html.write_attention_page(maps, ctx.out / html_name, layer, head,
                                            attention.finding(maps, index, layer, head))
    command = (f'attnlab viz attention --model {model} --text "{SENTENCE}" --token it --head-for animal '
               f'--out {name}.png' + (f" --html {html_name}" if page else ""))
    return Made(f"{name}.png", f"Attention of {model}", cap, command, html_name)


def _cross(ctx: _Context) -> Made:
    run = ctx.run(Kind.SEQ2SEQ)
    maps = attention.attention_maps(ctx.model(str(run)), TRANSLATE, cross=True)
    index = attention.default_query(maps)
    layer, head = attention.sharpest_layer(maps), None
    cap = attention.caption(maps, index, layer, head)
    attention.draw_attention(maps, index, layer, head, ctx.out / "attention-cross.png")
    attention_html.write_attention_page(maps, ctx.out / "attention-cross.html", layer, head,
                                        attention.finding(maps, index, layer, head))
    return Made("attention-cross.png", "Cross-attention of a translation run", cap,
                f'attnlab viz attention --model {run} --cross --text "{TRANSLATE}" --out attention-cross.png '
                f'--html attention-cross.html', "attention-cross.html")


def _context(ctx: _Context) -> Made:
    result = context.context_similarity(ctx.model("all-minilm-l6-v2"))
    context.draw_context(result, ctx.out / "context.png")
    return Made("context.png", "Contextual vectors", result.caption,
                "attnlab viz context --model all-minilm-l6-v2 --word bank --out context.png")


def _positions(ctx: _Context) -> Made:
    result = positions.positions_figure_data()
    positions.draw_positions(result, ctx.out / "positions.png")
    return Made("positions.png", "Positions", result.caption, "attnlab viz positions --out positions.png")


def _masks(ctx: _Context) -> Made:
    run = next((r for r, k in ctx.kinds.items() if k is Kind.SEQ2SEQ), None)
    tokenizer, pad, bos, _ = sources.translation_tokenizer(str(run) if run else None)
    src, tgt = sources.multi30k_pairs("val", 4)
    result = masks.batch_masks(tokenizer, src, tgt, pad, bos)
    masks.draw_masks(result, ctx.out / "masks.png")
    return Made("masks.png", "Attention masks", result.caption,
                "attnlab viz masks " + (f"--model {run} " if run else "") + "--out masks.png")


def _teacher_forcing(ctx: _Context) -> Made:
    run = ctx.run(Kind.SEQ2SEQ)
    src, tgt = sources.multi30k_pairs("test_2016_flickr", 1)
    result = teacher_forcing.teacher_forcing(ctx.model(str(run)), src[0], tgt[0])
    teacher_forcing.draw_teacher_forcing(result, ctx.out / "teacher-forcing.png")
    return Made("teacher-forcing.png", "Teacher forcing", result.caption,
                f"attnlab viz teacher-forcing --model {run} --out teacher-forcing.png")


def _schedule(ctx: _Context) -> Made:
    result = schedule.schedule_figure_data()
    schedule.draw_schedule(result, ctx.out / "schedule.png")
    return Made("schedule.png", "Learning-rate schedules and label smoothing", result.caption,
                "attnlab viz schedule --out schedule.png")


def _training(ctx: _Context) -> Made:
    runs = [r for r in ctx.kinds if (r / "metrics.jsonl").is_file()]
    if not runs:
        raise Skip("no run with a metrics.jsonl; train one with attnlab train --recipe NAME --out runs/NAME")
    curves = training.training_curves([str(r) for r in runs])
    training.draw_training(curves, ctx.out / "training.png")
    return Made("training.png", "Training curves", training.caption(curves),
                f"attnlab viz training --runs {' '.join(map(str, runs))} --out training.png")


def _complexity(ctx: _Context) -> Made:
    result = complexity.complexity(QUICK_LENGTHS, repeats=2)
    complexity.draw_complexity(result, ctx.out / "complexity.png")
    lengths = " ".join(map(str, QUICK_LENGTHS))
    return Made("complexity.png", "Attention cost against length", result.caption,
                f"attnlab viz complexity --lengths {lengths} --out complexity.png")


def _kv_cache(ctx: _Context) -> Made:
    result = kv_cache.kv_cache_timing(ctx.model("smollm2-135m"), sources.shakespeare_text(20000), QUICK_POSITIONS)
    kv_cache.draw_kv_cache(result, ctx.out / "kv-cache.png")
    return Made("kv-cache.png", "KV cache", result.caption, "attnlab viz kv-cache --model smollm2-135m --positions "
                + " ".join(map(str, QUICK_POSITIONS)) + " --out kv-cache.png")


def _moe(ctx: _Context) -> Made:
    run = ctx.run(Kind.CAUSAL_LM, moe_only=True)
    result = moe.moe_routing(ctx.model(str(run)), sources.shakespeare_text(2000))
    moe.draw_moe(result, ctx.out / "moe.png")
    return Made("moe.png", "Mixture-of-experts routing", result.caption, f"attnlab viz moe --model {run} --out moe.png")


def _bpe(ctx: _Context) -> Made:
    trace = bpe.bpe_merges()
    bpe.draw_bpe(trace, ctx.out / "bpe.png")
    return Made("bpe.png", "BPE merges", bpe.caption(trace), "attnlab viz bpe --out bpe.png")


JOBS = [("attention", lambda c: _attention(c, "all-minilm-l6-v2", "attention", True)),
        ("attention-causal", lambda c: _attention(c, "smollm2-135m", "attention-causal", False)),
        ("attention-cross", _cross), ("context", _context), ("positions", _positions), ("masks", _masks),
        ("teacher-forcing", _teacher_forcing), ("schedule", _schedule), ("training", _training),
        ("complexity", _complexity), ("kv-cache", _kv_cache), ("moe", _moe), ("bpe", _bpe)]


def make_all(out: str | Path, runs: list[str] | None = None) -> Gallery:
    """Draw every figure into `out` and write `out`/index.html.

    Args:
        runs: run directories (None: those under runs/).
    Returns:
        the figures made, the ones skipped (one line each) and the seconds taken.
    """
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = [Path(r) for r in runs] if runs is not None else find_runs()
    for r in run_dirs:
        if not r.is_dir():
            raise UserError(f"--runs {r} is not a directory")
    ctx, gallery = _Context(out, run_dirs), Gallery()
    for name, job in JOBS:
        t0 = time.perf_counter()
        try:
            gallery.figures.append(job(ctx))
            print(f"viz all: {name} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        except (Skip, FileNotFoundError) as err:  # a missing model, run or data set
            gallery.skipped.append(f"{name}: {err}")
            print(f"viz all: skipped {name}: {err}", file=sys.stderr)
    gallery.seconds = round(time.perf_counter() - start, 1)
    write_index(out, gallery)
    return gallery


def write_index(out: Path, gallery: Gallery) -> Path:
    """index.html: every figure with its caption and command; relative links, no external reference."""
    items = []
    for f in gallery.figures:
        page = f' · <a href="{html.escape(f.page)}">interactive page</a>' if f.page else ""
        items.append(f'<figure id="{html.escape(Path(f.name).stem)}"><img src="{html.escape(f.name)}" '
                     f'alt="{html.escape(f.title)}"><figcaption><b>{html.escape(f.title)}</b>{page}<br>'
                     f'{html.escape(f.caption)}<br><code>{html.escape(f.command)}</code></figcaption></figure>')
    skipped = "".join(f"<li>{html.escape(s)}</li>" for s in gallery.skipped)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnlab pictures</title><style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 1400px; color: #222; }}
figure {{ margin: 0 0 2.5em 0; }} img {{ max-width: 100%; border: 1px solid #ddd; }}
figcaption {{ font-size: 14px; line-height: 1.5; }} code {{ background: #f3f3f3; padding: 1px 4px; }}
</style></head><body>
<h1>attnlab pictures</h1>
<p>Made by <code>attnlab viz all</code> in {gallery.seconds:.0f} s from real models and runs.</p>
{"".join(items)}
{f"<h2>Skipped</h2><ul>{skipped}</ul>" if skipped else ""}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
