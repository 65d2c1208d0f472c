"""Convert any model attnlab loads into a Hugging Face model directory that transformers loads."""
from __future__ import annotations

import json
from pathlib import Path


def convert(source: str, out_dir: str | Path) -> dict:
    """Write the model at `source` (a name, a .gguf file, a HF directory or one of our run
    directories) to `out_dir` as config.json + model.safetensors + tokenizer files.

    Returns:
        {"from", "to", "architecture", "parameters"}.
    Raises:
        FileExistsError: when out_dir exists and is not empty. ValueError / FileNotFoundError: for a
            source that cannot be loaded, or a model option with no Hugging Face equivalent.
    """
    from attnlab.pretrained import _read_config, resolve

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--to {out} already exists and is not an empty directory")
    path = resolve(source)
    if path.is_dir() and _read_config(path).get("model_type") == "bert":
        from attnlab.interop.hf_bert import save_bert_hf
        from attnlab.pretrained import load_encoder

        loaded = load_encoder(source)
        save_bert_hf(loaded.model, out, path / "tokenizer.json")
    else:
        from attnlab.interop.hf import save_hf
        from attnlab.pretrained import load_causal_lm

        loaded = load_causal_lm(source)
        save_hf(loaded.model, out, loaded.tokenizer)
        if loaded.chat_template:  # add the template to the tokenizer_config.json save_hf wrote
            config_path = out / "tokenizer_config.json"
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
            config.update({"chat_template": loaded.chat_template,
                           **{f"{k}_token": v for k, v in loaded.special.items()}})
            config_path.write_text(json.dumps(config, indent=2))
    arch = json.loads((out / "config.json").read_text()).get("architectures", ["?"])[0]
    return {"from": str(path), "to": str(out), "architecture": arch,
            "parameters": sum(p.numel() for p in loaded.model.parameters())}
