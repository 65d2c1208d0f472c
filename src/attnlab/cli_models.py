"""Command-line sub-commands that run models: generate, chat, embed, classify, convert.

Each is a thin call into the library (generate.generate, chat.Chat, embed.embed, interop).
"""
from __future__ import annotations

import json
import sys

from attnlab.cli import _check_text, _nonnegative_float, _positive_int, _probability, _stdin_lines


def _cmd_generate(args) -> None:
    from attnlab.generate import check_context, generate
    from attnlab.pretrained import load_causal_lm
    from attnlab.sampling import check_sampling
    from attnlab.textstream import TextStream

    prompts = [_check_text(p, f"--prompt {i + 1}") for i, p in enumerate(args.prompt)]
    if any(p == "" for p in prompts):
        raise ValueError("--prompt is empty; give some text to continue")
    check_sampling(args.temperature, args.top_k, args.top_p)
    loaded = load_causal_lm(args.model)
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = [tokenizer.encode(p) for p in prompts]
    for p, i in zip(prompts, ids):
        if not i:
            raise ValueError(f"--prompt {p!r} has no character the model's tokenizer knows")
    max_new = args.max_new_tokens
    if max_new is None:  # as many as the context allows, up to 200
        unbounded = model.cfg.sliding_window is not None and model.cfg.positions == "rope"
        max_new = 200 if unbounded else max(1, min(200, model.cfg.max_seq_len - max(map(len, ids))))
    check_context(model, max(map(len, ids)), max_new)  # before any output
    kwargs = dict(max_new_tokens=max_new, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache)
    if len(prompts) == 1:  # stream the text as it is generated
        stream = TextStream(tokenizer, _write)
        _write(prompts[0])
        generate(model, ids, on_token=lambda row, token: stream.add(token), **kwargs)
        stream.finish()
        _write("\n")
        return
    for prompt, new in zip(prompts, generate(model, ids, **kwargs)):
        print(json.dumps({"prompt": prompt, "completion": tokenizer.decode(new)}), flush=True)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _cmd_chat(args) -> None:
    from attnlab.chat import Chat
    from attnlab.pretrained import load_causal_lm

    chat = Chat(load_causal_lm(args.model), args.system, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat: type a message; /reset starts over, /exit quits", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = sys.stdin.buffer.readline()
        if not raw:
            break
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise ValueError(f"stdin line is not valid UTF-8 (byte offset {e.start})") from None
        if text == "/exit":
            break
        if text == "/reset":
            chat.reset()
            print("(conversation reset)", file=sys.stderr)
            continue
        if not text:
            continue
        chat.send(text, on_text=_write)
        _write("\n")


def _cmd_embed(args) -> None:
    from attnlab.embed import embed
    from attnlab.pretrained import load_encoder

    texts = _texts(args.text)
    vectors = embed(load_encoder(args.model), texts)
    print(json.dumps([[round(x, 7) for x in row] for row in vectors.tolist()]))


def _cmd_classify(args) -> None:
    from pathlib import Path

    from attnlab.runs import model_type

    kind = model_type(Path(args.model))
    if kind == "vit":
        from attnlab.vision import classify_images
        if not args.inputs:
            raise ValueError("give image files to classify")
        results = classify_images(args.model, args.inputs)
    elif kind == "bert":
        from attnlab.text_classification import classify_texts
        texts = _texts(args.inputs)
        results = classify_texts(args.model, texts)
    else:
        raise ValueError(f"{args.model} is a {kind} model, not a classifier (sst2 / mnist-vit recipes)")
    for label, probability in results:
        print(f"{label}\t{probability:.4f}", flush=True)


def _texts(arguments: list[str]) -> list[str]:
    """The texts of the arguments, or else of stdin's lines; an empty one is refused by position."""
    where = "argument" if arguments else "stdin line"
    texts = [_check_text(t, f"argument {i + 1}") for i, t in enumerate(arguments)] if arguments else _stdin_lines()
    if not texts:
        raise ValueError("give at least one text (arguments, or one per stdin line)")
    empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(f"{where} {empty[0]} is empty; every {where.split()[-1]} must hold some text")
    return texts


def _cmd_convert(args) -> None:
    from attnlab.interop.convert import convert

    print(json.dumps(convert(args.source, args.to)))


def add_model_parsers(sub) -> None:
    """Register generate, chat, embed and convert on an argparse sub-parser set."""
    g = sub.add_parser("generate", help="continue a prompt with a language model (streamed to stdout)")
    g.add_argument("--model", required=True, help="a trained run directory, a HF model directory, a .gguf "
                   "file, or a name: smollm2-135m")
    g.add_argument("--prompt", required=True, action="append", help="text to continue; repeat for a batch "
                   "(then one JSON line per prompt)")
    _sampling_args(g, 0.8)
    g.add_argument("--no-cache", action="store_true", help="recompute every position at each step (no KV cache)")
    g.set_defaults(func=_cmd_generate)

    c = sub.add_parser("chat", help="multi-turn chat with an instruction-tuned model and its chat template "
                       "(stdin lines; /reset, /exit)")
    c.add_argument("--model", required=True, help="smollm2-135m, a .gguf file or a HF model directory")
    c.add_argument("--system", help="a system message")
    _sampling_args(c, 0.0, default_new=256)
    c.set_defaults(func=_cmd_chat)

    e = sub.add_parser("embed", help="sentence embeddings (mean-pooled, normalised) as a JSON list of lists")
    e.add_argument("--model", required=True, help="all-minilm-l6-v2 or a HF BERT directory")
    e.add_argument("text", nargs="*", help="texts (default: one per stdin line)")
    e.set_defaults(func=_cmd_embed)

    k = sub.add_parser("classify", help="label and probability per input: texts for a text classifier (sst2), "
                       "image files for a ViT")
    k.add_argument("--model", required=True, help="a trained classifier run directory")
    k.add_argument("inputs", nargs="*", help="texts (default: stdin lines) or image files")
    k.set_defaults(func=_cmd_classify)

    v = sub.add_parser("convert", help="write a model (GGUF file, HF directory, our run directory) as a HF "
                       "directory that transformers loads")
    v.add_argument("--from", dest="source", required=True, help="a name, .gguf file or model directory")
    v.add_argument("--to", required=True, help="the output directory")
    v.set_defaults(func=_cmd_convert)


def _seed(text: str) -> int:
    import argparse

    value = int(text)
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be in 0 .. 2**63 - 1, got {value}")
    return value


def _sampling_args(p, temperature: float, default_new: int | None = None) -> None:
    p.add_argument("--max-new-tokens", type=_positive_int, default=default_new,
                   help="tokens to generate (default: up to 200 within the context)" if default_new is None
                   else f"tokens per reply (default {default_new})")
    p.add_argument("--temperature", type=_nonnegative_float, default=temperature,
                   help=f"0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=_positive_int, help="sample among the K most probable tokens")
    p.add_argument("--top-p", type=_probability, help="sample from the smallest set holding probability P")
    p.add_argument("--seed", type=_seed, help="seed for reproducible sampling (0 .. 2**63 - 1)")
