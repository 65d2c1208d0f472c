"""Load any model attnlab runs, by name or path: a named pretrained model, a .gguf file, a Hugging
Face model directory, or one of our run directories.

Every load gives a tasks.LoadedModel (the model, what running it needs, and its family's task);
which family reads a path, and what it can do, the task registry says (tasks/registry.py).
"""
from __future__ import annotations

import sys

from attnlab.errors import UserError
from attnlab.nn.cpu_tuning import native_bf16
from attnlab.nn.quant import SCHEMES
from attnlab.nn.quant_linear import check_dtype, set_dtype
from attnlab.pretrained import resolve
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.registry import task_of_path
from attnlab.train.run_dir import is_run_dir

__all__ = ["LoadedModel", "load_model", "load_causal_lm", "load_encoder", "require_kind"]


def require_kind(loaded: LoadedModel, kind: Kind, what: str) -> LoadedModel:
    """`loaded` itself when it is of `kind`.

    Raises:
        UserError: naming the model, its kind and what `what` (e.g. "text generation") needs.
    """
    if loaded.kind is not kind:
        raise UserError(f"{loaded.path} is {loaded.task.described}; {what} needs {kind.described}")
    return loaded


def at_dtype(loaded: LoadedModel, dtype: str) -> LoadedModel:
    """Convert a loaded fp32 model to `dtype` (nn.quant_linear.set_dtype); block quantization is
    for the families that can be quantized (Task.quantizable).

    Raises:
        UserError: a block quantization for a family that has none.
    """
    if dtype in SCHEMES and not loaded.task.quantizable:
        raise UserError(f"dtype={dtype!r} (quantized weights) is not implemented for {loaded.task.described}; "
                        f"{loaded.path} runs at fp32 or bf16", param="dtype")
    set_dtype(loaded.model, dtype)
    return loaded


def load_model(name_or_path: str, dtype: str = "auto") -> LoadedModel:
    """Any model: a name (smollm2-135m, all-minilm-l6-v2), a GGUF file, a HF model directory
    (config.json + safetensors + tokenizer.json: llama, mistral, qwen2, mixtral, gpt2, mamba, bert), a
    PEFT LoRA adapter directory (its adapters merged into the base it names) or one of our run
    directories (a fine-tune's: its base with its adapters), at `dtype` (nn.quant_linear.DTYPES): "auto" = as stored (a GGUF file's
    Q8_0 / Q4_0 / Q4_1 matrices stay quantized; everything else fp32), "fp32" (GGUF dequantized: the
    reference), "bf16" (where the CPU has no native bf16 products, one line on stderr says it is slow
    there), or a block quantization "q8_0" / "q4_0" / "q4_1" (quantizable families).

    Raises:
        FileNotFoundError, UserError: naming what is missing or unsupported (a dtype we do not
            implement is named with the supported ones).
    """
    check_dtype(dtype)
    path = resolve(name_or_path)
    task = task_of_path(path)
    if dtype == "bf16" and not native_bf16():
        print("attnlab: dtype bf16 on a CPU without native bf16 products (AVX512-BF16 or AMX): PyTorch "
              "emulates them, many times slower than fp32 or q8_0 here", file=sys.stderr)
    if path.is_file():
        return task.load_gguf(path, dtype)
    return at_dtype(task.load(path) if is_run_dir(path) else task.load_hf(path), dtype)


def load_causal_lm(name_or_path: str, dtype: str = "auto") -> LoadedModel:
    """A model that continues text (load_model at `dtype`, then checked to be a causal LM).

    Raises:
        FileNotFoundError, UserError: naming what is missing, unsupported or of another kind.
    """
    return require_kind(load_model(name_or_path, dtype), Kind.CAUSAL_LM, "text generation")


def load_encoder(name_or_path: str) -> LoadedModel:
    """An encoder that embeds text: all-minilm-l6-v2, a HF BERT directory or one of our BERT runs.

    Raises:
        FileNotFoundError, UserError: naming what is missing, unsupported or of another kind.
    """
    path = resolve(name_or_path)
    if path.is_file():
        raise UserError(f"{name_or_path} is a single-file (GGUF) language model; this needs a BERT encoder "
                        f"directory such as all-minilm-l6-v2")
    return require_kind(load_model(name_or_path), Kind.ENCODER, "embedding text")
