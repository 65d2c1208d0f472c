"""Convert any model attnlab loads into a Hugging Face model directory that transformers loads."""
from __future__ import annotations

import json
from pathlib import Path

from attnlab.jsonfile import read_json, write_json_atomic
from attnlab.load import load_model
from attnlab.tasks.registry import get_task


def convert(source: str, out_dir: str | Path) -> dict:
    """Write the model at `source` (a name, a .gguf file, a HF directory or one of our run
    directories) to `out_dir` as config.json + model.safetensors + tokenizer files.

    Returns:
        {"from", "to", "architecture", "parameters"}.
    Raises:
        FileExistsError: when out_dir exists and is not empty. ValueError / FileNotFoundError: for a
            source that cannot be loaded, a model type with no Hugging Face export, or a model option
            with no Hugging Face equivalent.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--to {out} already exists and is not an empty directory")
    loaded = load_model(source)
    tokenizer_file = loaded.source / "tokenizer.json" if loaded.source.is_dir() else None
    get_task(loaded.model_type).export_hf(loaded.model, loaded.tokenizer, out, tokenizer_file)
    if loaded.chat_template:  # add the template to the tokenizer_config.json the export wrote
        config_path = out / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        config.update({"chat_template": loaded.chat_template, **{f"{k}_token": v for k, v in loaded.special.items()}})
        write_json_atomic(config_path, config)
    arch = json.loads((out / "config.json").read_text()).get("architectures", ["?"])[0]
    return {"from": str(loaded.source), "to": str(out), "architecture": arch,
            "parameters": loaded.model.num_parameters()}
