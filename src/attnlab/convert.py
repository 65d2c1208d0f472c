"""Convert any model attnlab loads into a Hugging Face model directory that transformers loads."""
from __future__ import annotations

import json
from pathlib import Path

from attnlab.errors import UserError, naming
from attnlab.interop.gguf_write import write_gguf
from attnlab.jsonfile import read_json, write_json_atomic
from attnlab.load import load_model


def convert(source: str, out_dir: str | Path, quantize: str | None = None) -> dict:
    """Write the model at `source` (a name, a .gguf file, a HF directory or one of our run
    directories) to `out_dir` as config.json + model.safetensors + tokenizer files, or, when
    `out_dir` ends in .gguf, as one GGUF file (interop/gguf_write.py; LLaMA-family GPT models) with
    its weight matrices at `quantize` ("fp32" by default, "q8_0", "q4_0", "q4_1"). What a model can
    be written as, its family's task says (Task.exports_hf, Task.gguf).

    Returns:
        {"from", "to", "architecture", "parameters"} (GGUF: also "type", "tensors", "bytes").
    Raises:
        FileExistsError: when out_dir exists and is not an empty directory (a .gguf file is
            replaced). UserError / FileNotFoundError: for a source that cannot be loaded, a model
            type with no export, a model option with no equivalent, or quantize with a directory.
    """
    out = Path(out_dir)
    if out.suffix == ".gguf":
        loaded = load_model(source, "fp32")
        if not loaded.task.gguf:
            raise UserError(f"GGUF export holds LLaMA-family GPT models; {source} is {loaded.task.described}")
        record = write_gguf(loaded.model, loaded.tokenizer, out, quantize or "fp32", loaded.chat_template)
        return {"from": str(loaded.path), **record, "architecture": "llama",
                "parameters": loaded.model.num_parameters()}
    if quantize is not None:
        raise UserError(f"quantize={quantize!r} applies to GGUF output only (out_dir=FILE.gguf); a Hugging Face "
                        f"directory is written in fp32", param=("quantize", "out_dir"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise naming(FileExistsError(f"out_dir={out} already exists and is not an empty directory"), "out_dir")
    loaded = load_model(source, "fp32")
    tokenizer_file = loaded.path / "tokenizer.json" if loaded.path.is_dir() else None
    loaded.task.export_hf(loaded.model, loaded.tokenizer, out, tokenizer_file)
    if loaded.chat_template:  # add the template to the tokenizer_config.json the export wrote
        config_path = out / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        config.update({"chat_template": loaded.chat_template, **{f"{k}_token": v for k, v in loaded.special.items()}})
        write_json_atomic(config_path, config)
    arch = json.loads((out / "config.json").read_text()).get("architectures", ["?"])[0]
    return {"from": str(loaded.path), "to": str(out), "architecture": arch,
            "parameters": loaded.model.num_parameters()}
