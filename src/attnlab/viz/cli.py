"""`attnlab viz KIND ...`: one sub-command per picture, each a thin call into its viz module.

    attnlab viz attention [--model NAME|DIR] [--text T] [--token W] [--head-for W | --layer L --head H]
                          [--cross [--target T]] [--out FILE.png] [--html FILE.html]
    attnlab viz context | positions | masks | teacher-forcing | schedule | training | complexity
                | kv-cache | moe | bpe   [options] [--out FILE.png]
    attnlab viz all --out DIR [--runs RUN ...]

Each prints one JSON line of the numbers it drew on stdout and "wrote FILE" on stderr. Bad input
raises ValueError with a one-line reason (exit 2 through attnlab.cli.main).
"""
from __future__ import annotations

import argparse
import json
import sys

from attnlab.errors import UserError
from attnlab.viz import attention, attention_html, bpe, complexity, context, gallery, kv_cache, masks, moe
from attnlab.viz import positions, schedule, sources, teacher_forcing, training
from attnlab.tasks.kinds import Kind

KINDS = ("attention", "context", "positions", "masks", "teacher-forcing", "schedule", "training", "complexity",
         "kv-cache", "moe", "bpe", "all")
SENTENCE, TRANSLATE = attention.EXAMPLE, attention.CROSS_EXAMPLE


def add_viz_parser(subparsers) -> None:
    """Add `viz` with one sub-command per picture to the main parser's sub-parsers."""
    p = subparsers.add_parser("viz", help="draw a picture of what a model does (matplotlib; the viz extra)")
    sub = p.add_subparsers(dest="viz_kind", metavar="KIND", required=True, help=", ".join(KINDS))

    a = _kind(sub, "attention", "one token's attention in every layer and head, and one head's full map",
              cmd_attention)
    a.add_argument("--model", default="all-minilm-l6-v2", help="all-minilm-l6-v2 (default), smollm2-135m, a "
                   "GGUF file, or a run directory (language model or translation)")
    a.add_argument("--text", default=SENTENCE, help=f'default "{SENTENCE}"')
    a.add_argument("--token", help="the query token (default: the first that is not special)")
    a.add_argument("--head-for", metavar="WORD", help="draw the head that puts the most weight on WORD")
    a.add_argument("--layer", type=int, help="the layer of the full map (default: the strongest head's; "
                   "with --cross, the layer with the sharpest mean-of-heads alignment)")
    a.add_argument("--head", help="the head of the full map, or 'mean' (the mean of the layer's heads; "
                   "the default with --cross)")
    a.add_argument("--cross", action="store_true", help="translation runs: decoder→encoder attention")
    a.add_argument("--target", help="with --cross: the translation (default: the model's greedy one)")
    a.add_argument("--html", help="also write the interactive page (self-contained HTML)")

    c = _kind(sub, "context", "one word's vector in two sentences, layer by layer", cmd_context)
    c.add_argument("--model", default="all-minilm-l6-v2", help="an encoder (default all-minilm-l6-v2)")
    c.add_argument("--word", default="bank")
    c.add_argument("--sentence", action="append", help=f"two sentences (default {' / '.join(context.SENTENCES)})")
    c.add_argument("--probes", nargs="+", default=list(context.PROBES))

    _kind(sub, "positions", "sinusoidal encodings and RoPE", cmd_positions)

    m = _kind(sub, "masks", "the boolean masks of a real padded Multi30k batch", cmd_masks)
    m.add_argument("--model", help="a translation run (its tokenizer); default: a small BPE trained here")
    m.add_argument("--sentences", type=int, default=4, help="batch size (validation pairs; default 4)")
    m.add_argument("--window", type=int, default=4, help="sliding window W (default 4)")

    t = _kind(sub, "teacher-forcing", "a parallel teacher-forced pass against greedy decoding", cmd_teacher)
    t.add_argument("--model", required=True, help="a translation run directory")
    t.add_argument("--text", help="an English sentence (default: a Multi30k test pair)")
    t.add_argument("--target", help="its German reference (with --text)")
    t.add_argument("--pair", type=int, default=0, help="which test_2016_flickr pair (default 0)")

    s = _kind(sub, "schedule", "learning-rate schedules of recipes, and label smoothing", cmd_schedule)
    s.add_argument("--recipe", action="append", help=f"a recipe (repeatable; default {' and '.join(schedule.RECIPES)})")
    s.add_argument("--steps", type=int, help="steps to draw (default: the recipe's budget)")
    s.add_argument("--epsilon", type=float, help="label smoothing ε (default: the first recipe's, else 0.1)")

    r = _kind(sub, "training", "curves of runs' metrics.jsonl, overlaid", cmd_training)
    r.add_argument("--runs", nargs="+", required=True, metavar="RUN", help="run directories")

    x = _kind(sub, "complexity", "measured time and memory of causal attention against length", cmd_complexity)
    x.add_argument("--lengths", type=int, nargs="+", default=list(complexity.LENGTHS))
    x.add_argument("--heads", type=int, default=4)
    x.add_argument("--head-dim", type=int, default=64)

    k = _kind(sub, "kv-cache", "decoding time with and without the KV cache; MHA/GQA/MQA cache sizes", cmd_kv)
    k.add_argument("--model", default="smollm2-135m", help="a decoder (default smollm2-135m)")
    k.add_argument("--positions", type=int, nargs="+", default=list(kv_cache.POSITIONS))

    o = _kind(sub, "moe", "tokens routed to each expert, per layer", cmd_moe)
    o.add_argument("--model", required=True, help=moe.MOE_RUN)
    o.add_argument("--text", help="the text (default: the start of Tiny Shakespeare's held-out part)")
    o.add_argument("--chars", type=int, default=2000, help="characters of the default text (default 2000)")

    b = _kind(sub, "bpe", "BPE merges step by step (as `attnlab tokenizer viz`)", cmd_bpe)
    b.add_argument("--words", default=bpe.DEFAULT_WORDS)
    b.add_argument("--merges", type=int, default=10)

    g = sub.add_parser("all", help="every figure the models and runs allow, with DIR/index.html")
    g.add_argument("--out", required=True, help="folder for the figures and index.html")
    g.add_argument("--runs", nargs="+", metavar="RUN", help="run directories (default: those under runs/)")
    g.set_defaults(func=cmd_all)


def _kind(sub, name: str, help_: str, func) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_)
    p.add_argument("--out", default=f"{name}.png", help=f"image to write (default {name}.png)")
    p.set_defaults(func=func)
    return p


def _done(summary: dict, *paths) -> None:
    print(json.dumps(summary))
    for path in paths:
        if path:
            print(f"wrote {path}", file=sys.stderr)


def _in_range(value: int | None, n: int, name: str) -> None:
    if value is not None and not 0 <= value < n:
        raise UserError(f"--{name} must be in 0..{n - 1}, got {value}")


def _head(text: str | None, heads: int) -> int | None:
    """--head: an index in 0..heads-1, or "mean" (None)."""
    if text is None or text == "mean":
        return None
    if not text.lstrip("-").isdigit():
        raise UserError(f"--head must be a head index or 'mean', got {text!r}")
    _in_range(int(text), heads, "head")
    return int(text)


def cmd_attention(args) -> None:
    maps = attention.attention_maps(sources.load_for_attention(args.model), args.text, args.cross, args.target)
    index = attention.find_token(maps.query_tokens, args.token) if args.token else attention.default_query(maps)
    layers, heads = maps.weights.shape[:2]
    chosen = _head(args.head, heads)
    _in_range(args.layer, layers, "layer")
    if args.head_for:
        key = attention.find_token(maps.key_tokens, args.head_for, "--head-for")
        layer, head = attention.head_for(maps, index, key)
    elif args.cross:
        layer, head = attention.sharpest_layer(maps), None
    else:
        layer, head = attention.strongest_head(maps, index)
    layer = args.layer if args.layer is not None else layer
    head = head if args.head is None else chosen
    attention.draw_attention(maps, index, layer, head, args.out)
    if args.html:
        attention_html.write_attention_page(maps, args.html, layer, head, attention.finding(maps, index, layer, head))
    _done({"model": args.model, "kind": maps.kind, "token": maps.query_tokens[index], "position": index,
           "target": maps.target, "layer": layer, "head": "mean" if head is None else head,
           "top_heads": attention.top_heads(maps, index)}, args.out, args.html)


def cmd_context(args) -> None:
    sentences = tuple(args.sentence or context.SENTENCES)
    if len(sentences) != 2:
        raise UserError(f"--sentence must be given exactly twice, got {len(sentences)}")
    result = context.context_similarity(sources.load(args.model, (Kind.ENCODER,), "the context figure"), args.word,
                                        sentences, tuple(args.probes))
    context.draw_context(result, args.out)
    _done({"word": args.word, "layers": result.layers, "cosine": [round(c, 4) for c in result.cosine],
           "nearest": [result.nearest(0), result.nearest(1)]}, args.out)


def cmd_positions(args) -> None:
    result = positions.positions_figure_data()
    positions.draw_positions(result, args.out)
    _done({"pe_dot_spread": result.pe_spread, "rope_score_spread": result.rope_spread}, args.out)


def cmd_masks(args) -> None:
    if args.sentences < 1 or args.window < 1:
        raise UserError("--sentences and --window must be >= 1")
    tokenizer, pad, bos, _ = sources.translation_tokenizer(args.model)
    src, tgt = sources.multi30k_pairs("val", args.sentences)
    result = masks.batch_masks(tokenizer, src, tgt, pad, bos, args.window)
    masks.draw_masks(result, args.out)
    _done({"batch": list(result.src.shape), "decoder_input": list(result.tgt_in.shape), "row": result.row}, args.out)


def cmd_teacher(args) -> None:
    source = sources.load(args.model, (Kind.SEQ2SEQ,), "the teacher-forcing figure")
    if (args.text is None) != (args.target is None):
        raise UserError("give --text and --target together (or neither, for a Multi30k test pair)")
    if args.text is None:
        src, tgt = sources.multi30k_pairs("test_2016_flickr")
        if not 0 <= args.pair < len(src):
            raise UserError(f"--pair must be in 0..{len(src) - 1}, got {args.pair}")
        args.text, args.target = src[args.pair], tgt[args.pair]
    result = teacher_forcing.teacher_forcing(source, args.text, args.target)
    teacher_forcing.draw_teacher_forcing(result, args.out)
    _done({"predicted": result.predicted, "target": result.target, "greedy": result.greedy}, args.out)


def cmd_schedule(args) -> None:
    result = schedule.schedule_figure_data(tuple(args.recipe or schedule.RECIPES), args.steps, args.epsilon)
    schedule.draw_schedule(result, args.out)
    _done({c.recipe: {"schedule": c.schedule, "peak_step": c.peak[0], "peak_lr": c.peak[1]} for c in result.curves},
          args.out)


def cmd_training(args) -> None:
    runs = training.training_curves(args.runs)
    training.draw_training(runs, args.out)
    _done({r.name: {"log_records": len(r.train.get("step", [])), "evaluations": len(r.val.get("step", []))}
           for r in runs}, args.out)


def cmd_complexity(args) -> None:
    result = complexity.complexity(tuple(args.lengths), args.heads, args.head_dim)
    complexity.draw_complexity(result, args.out)
    _done({"lengths": result.lengths, "seconds": result.seconds, "peak_bytes": result.memory,
           "time_slope": {i: round(result.slope(result.seconds[i]), 3) for i in complexity.IMPLS}}, args.out)


def cmd_kv(args) -> None:
    source = sources.load(args.model, (Kind.CAUSAL_LM,), "the kv-cache figure")
    result = kv_cache.kv_cache_timing(source, sources.shakespeare_text(20000), tuple(args.positions))
    kv_cache.draw_kv_cache(result, args.out)
    _done({"positions": result.positions, "seconds": result.seconds, "cache_bytes": result.cache_bytes}, args.out)


def cmd_moe(args) -> None:
    source = sources.load(args.model, (Kind.CAUSAL_LM,), "the moe figure")
    result = moe.moe_routing(source, args.text if args.text is not None else sources.shakespeare_text(args.chars))
    moe.draw_moe(result, args.out)
    _done({"counts": result.counts.tolist(), "consistency": round(result.consistency, 4)}, args.out)


def cmd_bpe(args) -> None:
    trace = bpe.bpe_merges(args.words, args.merges)
    print(bpe.format_trace(trace), file=sys.stderr)
    bpe.draw_bpe(trace, args.out)
    _done({"merges": [(s.left + s.right).decode("utf-8", "replace") for s in trace.steps]}, args.out)


def cmd_all(args) -> None:
    made = gallery.make_all(args.out, args.runs)
    _done({"made": [f.name for f in made.figures], "skipped": made.skipped, "seconds": made.seconds},
          f"{args.out}/index.html")
