"""Command-line sub-commands that run models: translate, generate, chat, embed, classify, convert.

Each is a thin call into the library (tasks.translation.translate, generate.generate, chat.Chat,
embed.embed, a task's classify, convert.convert).
"""
from __future__ import annotations

import json
import sys

import torch

from attnlab.chat import Chat
from attnlab.cli.args import (beam, check_text, nonnegative_float, positive_int, probability, seed, stdin_lines,
                              texts)
from attnlab.cli.decode_stats import DecodeStats
from attnlab.convert import convert
from attnlab.embed import embed
from attnlab.engines import ENGINES, KV_DTYPE_NAMES, engine_name
from attnlab.errors import UserError
from attnlab.generate import check_context, generate
from attnlab.interop.gguf_write import GGUF_OUT_TYPES
from attnlab.load import load_causal_lm, load_encoder, require_kind
from attnlab.nn.quant_linear import DTYPES
from attnlab.sampling import check_sampling
from attnlab.tasks.kinds import Kind
from attnlab.tasks.registry import load_run
from attnlab.tasks.translation import TranslationDataConfig, translate
from attnlab.textstream import TextStream


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_translate(args) -> None:
    lines = [check_text(t, f"argument {i + 1}") for i, t in enumerate(args.text)] if args.text else stdin_lines()
    run = require_kind(load_run(args.model), Kind.SEQ2SEQ, "translate")
    data = TranslationDataConfig.from_dict(run.config["data"])
    todo = [i for i, x in enumerate(lines) if x.strip()]  # empty lines are skipped (an empty line out)
    out = [""] * len(lines)
    hyps = translate(run.model, run.tokenizer, [lines[i].strip() for i in todo], args.beam or data.beam_size,
                     data.length_penalty, data.beam_stopping)
    for i, hyp in zip(todo, hyps):
        out[i] = hyp
    for hyp in out:
        print(hyp, flush=True)


def cmd_generate(args) -> None:
    use_threads(args)
    prompts = [check_text(p, f"--prompt {i + 1}") for i, p in enumerate(args.prompt)]
    if any(p == "" for p in prompts):
        raise UserError("--prompt is empty; give some text to continue")
    check_sampling(args.temperature, args.top_k, args.top_p)
    loaded = load_causal_lm(args.model, args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = [tokenizer.encode(p) for p in prompts]
    for p, i in zip(prompts, ids):
        if not i:
            raise UserError(f"--prompt {p!r} has no character the model's tokenizer knows")
    max_new = 200 if args.max_new_tokens is None else args.max_new_tokens
    check_context(model, max(map(len, ids)), max_new)  # before any output
    # before any output: an engine asked for by name that does not run the model, or a kv_dtype it refuses
    engine_name(model, args.engine, args.kv_dtype)
    kwargs = dict(max_new_tokens=max_new, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache,
                  stop_tokens=[] if args.ignore_eos else None, engine=args.engine, kv_dtype=args.kv_dtype)
    stats = DecodeStats(sum(map(len, ids))) if args.stats else None
    if len(prompts) == 1:  # stream the text as it is generated
        stream = TextStream(tokenizer, _write)
        _write(prompts[0])

        def on_token(row, token):
            stream.add(token)
            if stats is not None:
                stats.on_token(row, token)
        if stats is not None:
            stats.start()
        generate(model, ids, on_token=on_token, **kwargs)
        stream.finish()
        _write("\n")
    else:
        if stats is not None:
            stats.start()
        outs = generate(model, ids, on_token=None if stats is None else stats.on_token, **kwargs)
        for prompt, new in zip(prompts, outs):
            print(json.dumps({"prompt": prompt, "completion": tokenizer.decode(new)}), flush=True)
    if stats is not None:
        print(stats.line(), file=sys.stderr, flush=True)


def cmd_chat(args) -> None:
    use_threads(args)
    chat = Chat(load_causal_lm(args.model, args.dtype), args.system, max_new_tokens=args.max_new_tokens,
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
            raise UserError(f"stdin line is not valid UTF-8 (byte offset {e.start})") from None
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


def cmd_embed(args) -> None:
    vectors = embed(load_encoder(args.model), texts(args.text))
    print(json.dumps([[round(x, 7) for x in row] for row in vectors.tolist()]))


def cmd_classify(args) -> None:
    run = load_run(args.model)
    inputs = args.inputs if run.task.takes_images else texts(args.inputs)
    for label, p in run.task.classify(run, inputs):
        print(f"{label}\t{p:.4f}", flush=True)


def cmd_convert(args) -> None:
    print(json.dumps(convert(args.source, args.out_dir, args.quantize)))


def engine_args(p) -> None:
    """--engine and --kv-dtype on a command that decodes with an engine (generate, serve)."""
    p.add_argument("--engine", choices=ENGINES, default="auto", help="decode engine: auto (the fused C++ step "
                   "where it runs the model, else the reference), fused-cpp, reference (the model's own forward)")
    p.add_argument("--kv-dtype", choices=KV_DTYPE_NAMES, default="auto", help="the fused engine's KV cache "
                   "dtype: auto (fp16 for block-quantized weights, as llama.cpp's default cache; else fp32), "
                   "fp32, fp16")


def threads_arg(p) -> None:
    """--threads on a command that decodes (generate, chat, serve); use_threads applies it."""
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's, all cores; on a machine "
                   "other work keeps busy, fewer run faster: threads that wait for each other at every step lose "
                   "their turn to the other processes)")


def use_threads(args) -> None:
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def dtype_arg(p) -> None:
    """--dtype on a command that loads a language model."""
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights in memory: auto (as stored: a GGUF file's Q8_0/Q4_0/Q4_1 stay quantized, "
                   "else fp32), fp32 (GGUF dequantized; the reference), bf16 (slow on CPUs without AVX512-BF16 or AMX), "
                   "or a block quantization "
                   "q8_0 / q4_0 / q4_1 (int8 kernels; GPT-family models)")


def _sampling_args(p, temperature: float, default_new: int | None = None) -> None:
    p.add_argument("--max-new-tokens", type=positive_int, default=default_new,
                   help="tokens to generate (default 200)" if default_new is None
                   else f"tokens per reply (default {default_new})")
    p.add_argument("--temperature", type=nonnegative_float, default=temperature,
                   help=f"0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=positive_int, help="sample among the K most probable tokens")
    p.add_argument("--top-p", type=probability, help="sample from the smallest set holding probability P")
    p.add_argument("--seed", type=seed, help="seed for reproducible sampling (0 .. 2**63 - 1)")


def add_model_parsers(sub) -> None:
    """Register translate, generate, chat, embed, classify and convert on the main parser's sub-parsers."""
    tr = sub.add_parser("translate", help="translate TEXT arguments, or stdin lines; one line out each "
                        "(an empty line in gives an empty line out)")
    tr.add_argument("--model", required=True, help="trained model directory")
    tr.add_argument("--beam", type=beam, help="beam size 1..64 (1 = greedy; default: the run's beam_size, 4)")
    tr.add_argument("text", nargs="*", help="sentences to translate (default: read stdin)")
    tr.set_defaults(func=cmd_translate)

    g = sub.add_parser("generate", help="continue a prompt with a language model (streamed to stdout)")
    g.add_argument("--model", required=True, help="a trained run directory (a fine-tune's: its base with its "
                   "adapters), a HF model directory, a PEFT adapter directory, a .gguf file, or a name: smollm2-135m")
    g.add_argument("--prompt", required=True, action="append", help="text to continue; repeat for a batch "
                   "(then one JSON line per prompt)")
    _sampling_args(g, 0.8)
    g.add_argument("--no-cache", action="store_true", help="recompute every position at each step (no KV cache)")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-text token: generate "
                   "exactly --max-new-tokens")
    g.add_argument("--stats", action="store_true", help="print the prefill and decode tok/s of the run on stderr "
                   "(timed in the process, loading left out, as llama.cpp's CLI prints them)")
    engine_args(g)
    dtype_arg(g)
    threads_arg(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="multi-turn chat with an instruction-tuned model and its chat template "
                       "(stdin lines; /reset, /exit)")
    c.add_argument("--model", required=True, help="smollm2-135m, a .gguf file, a HF model directory, a PEFT "
                   "adapter directory or a fine-tune run")
    c.add_argument("--system", help="a system message")
    _sampling_args(c, 0.0, default_new=256)
    dtype_arg(c)
    threads_arg(c)
    c.set_defaults(func=cmd_chat)

    e = sub.add_parser("embed", help="sentence embeddings (mean-pooled, normalised) as a JSON list of lists")
    e.add_argument("--model", required=True, help="all-minilm-l6-v2 or a HF BERT directory")
    e.add_argument("text", nargs="*", help="texts (default: one per stdin line)")
    e.set_defaults(func=cmd_embed)

    k = sub.add_parser("classify", help="label and probability per input: texts for a text classifier (sst2), "
                       "image files for a ViT")
    k.add_argument("--model", required=True, help="a trained classifier run directory")
    k.add_argument("inputs", nargs="*", help="texts (default: stdin lines) or image files")
    k.set_defaults(func=cmd_classify)

    v = sub.add_parser("convert", help="write a model (GGUF file, HF directory, our run directory) as a HF "
                       "directory that transformers loads, or (--to FILE.gguf) as a GGUF file llama.cpp runs")
    v.add_argument("--from", dest="source", required=True, help="a name, .gguf file or model directory (a "
                   "fine-tune run or PEFT adapter directory: the merged model)")
    v.add_argument("--to", dest="out_dir", required=True, help="the output directory, or a .gguf file (LLaMA-family GPT models)")
    v.add_argument("--quantize", choices=GGUF_OUT_TYPES, help="GGUF out only: the weight matrices' type "
                   "(default fp32; norms stay F32)")
    v.set_defaults(func=cmd_convert)
