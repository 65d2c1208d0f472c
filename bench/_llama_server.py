"""llama.cpp's server for bench/serve.py: an existing binary, or one built once from the llama.cpp
source that llama-cpp-python's PyPI sdist vendors, into ~/.cache/attnlab/llama-server (bench only;
never in the repository).

    pip download --no-binary :all: --no-deps llama-cpp-python==VERSION   (the sdist, from PyPI)
    cmake -S <sdist>/vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
    cmake --build build --target llama-server -j
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"  # the llama-cpp-python release whose vendored llama.cpp the README's figures used
CACHE = Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab")) / "llama-server"


def ensure(binary: str | None) -> tuple[str, str | None]:
    """(path of a llama-server binary, the sdist version it was built from or None when given)."""
    if binary:
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"--llama-server {binary}: not an executable file")
        return binary, None
    built = CACHE / f"build-{VERSION}" / "bin" / "llama-server"
    if built.is_file():
        return str(built), VERSION
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server from llama-cpp-python {VERSION}'s sdist into {CACHE} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(CACHE),
                    f"llama-cpp-python=={VERSION}"], check=True)
    sdist = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
    source = CACHE / f"llama_cpp_python-{VERSION}"
    if not source.is_dir():
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    build = CACHE / f"build-{VERSION}"
    subprocess.run(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build), "-DLLAMA_CURL=OFF",
                    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=ON"], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                   check=True)
    return str(built), VERSION


def version(binary: str) -> str | None:
    """The binary's own `--version` line (llama.cpp's version and commit), or None."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((line.strip() for line in (out.stdout + out.stderr).splitlines() if line.startswith("version:")), None)
