"""The product y = x · Wᵀ of fp32 activations and a block-quantized weight (nn/quant.py).

Shape legend: R rows, I in_features, O out_features, NB = I / 32.
Products of fewer than PREFILL_ROWS rows (decoding) use int8 arithmetic per 32-block, llama.cpp's
way: F.linear(dequantize(quantize_activations(x)), dequantize(W)). Products of more rows (prefill,
scoring) are compute-bound, and there a GEMM of the weight dequantized for the call beats int8 dot
products, in the dtype cpu_tuning.prefill_dtype chooses for the CPU, from the rows
cpu_tuning.prefill_rows chooses (32 where bf16 is native, 256 elsewhere): "bf16" where it multiplies
bf16 natively (oneDNN; AMX tiles on CPUs that have them): y = F.linear(bf16(x), bf16(Ŵ)) (fp32
dequantization rounded to nearest even), accumulated in fp32 and rounded to bf16 on output
(bench/quant_kernels.py measures both; at 64 rows the bf16 route is about 1.8× faster there);
"fp32" elsewhere (bf16 products emulated are slower than fp32 ones): y = F.linear(x, Ŵ).
Two implementations of each formula:
    "cpp"    quant_kernel.cpp, a small C++ extension (AVX512-VNNI int8 dot products per 32-block,
             llama.cpp's scheme), compiled with torch.utils.cpp_extension at first use (about a minute,
             cached under ~/.cache/torch_extensions, one build per version of the sources, checkout and
             instruction set) on x86-64 CPUs with a C++ compiler: natively with AVX512-VNNI, and
             through simd_compat.h (SIMDe) on CPUs with AVX2, FMA and F16C only (INSTRUCTION_SETS). The same extension holds the fused decode step
             (fused_decode.cpp, used by nn/fused_decode.py), which shares the int8 code (quant_kernel.h),
             Mamba's selective scan and causal convolution (ssm_scan.cpp, causal_conv.cpp: nn/ssm.py,
             nn/causal_conv.py), RMSNorm's training pass (rms_norm.cpp: nn/norm.py), and the short
             attention of training (short_attention.cpp:
             nn/short_attention.py);
    "torch"  the pure-PyTorch reference: dequantize W (in slices of rows) and call F.linear.
A weight in the kernel's tiled layout (nn/quant.py QuantWeight.tile, made once by
nn/quant_linear.py prepare) runs the tiled kernel (quant_tiles.h); one in ggml's rows the row tiles.
The C++ kernel is used when it builds; otherwise (no compiler, another CPU, the build failed, or
ATTNLAB_QUANT_KERNEL=torch) the fallback runs, with one warning on stderr saying why. Both agree up to
fp32 summation order (tests/nn/test_quant_linear.py).
"""
from __future__ import annotations

import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import simde_py  # SIMDe's headers, for the AVX2 build (a few hundred KB of headers, nothing imported)
import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.nn import cpu_tuning
from attnlab.nn.quant import BLOCK, SCHEMES, QuantWeight, dequantize, quantize_activations

try:
    import fcntl  # POSIX; the extension is only built on x86-64 Linux (instruction_set)
except ImportError:  # pragma: no cover - Windows
    fcntl = None

SOURCES = [Path(__file__).with_name(n) for n in ("quant_kernel.cpp", "fused_decode.cpp", "ssm_scan.cpp",
                                                  "causal_conv.cpp", "short_attention.cpp", "rms_norm.cpp")]
# every header beside the sources (package data nn/*.h): each is part of the build's digest (_extension_name),
# so a changed header, one added since too, builds anew (a list by hand had missed one: a stale build loaded)
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
SCHEME_ID = {s: i for i, s in enumerate(SCHEMES)}  # = quant_kernel.h enum Scheme (tests/nn/test_kernel_ids.py)
# -ffp-contract=off: a · b + c rounds twice, as PyTorch's separate ops do (explicit FMA intrinsics stay FMA).
# -fopenmp: at::parallel_for is an inline template that runs serially unless the extension itself is built
# with OpenMP; linked by soname, it shares torch's libgomp (and its thread count) at run time.
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]
# The sources are written with AVX512 intrinsics. Each instruction set the extension builds for: the
# CPU flags it needs (/proc/cpuinfo) and the compiler flags. "avx512" runs them natively; "avx2" (CPUs
# without AVX512, e.g. AMD Zen 2/3) compiles the same sources through simd_compat.h, which maps each
# AVX512 intrinsic onto two AVX2 halves with SIMDe (the header-only library: the simde-py package, a
# dependency, ships its headers; Debian's libsimde-dev or a directory on $CPATH serve too), so both
# builds compute the same values (the int32 block sums exactly, fp32 in the same order).
INSTRUCTION_SETS = {
    "avx512": ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma"},
               ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"]),
    "avx2": ({"avx2", "fma", "f16c"}, ["-mavx2", "-mfma", "-mf16c"]),
}
SIMDE_HEADER = "simde/x86/avx512.h"
SIMDE_DIRS = ("/usr/include", "/usr/local/include")  # and $CPATH's: where the compiler looks by itself
LDFLAGS = ["-fopenmp"]
TUNING_FIELDS = ("parallel_bytes", "prefetch_q", "prefetch_f32", "one_region", "prefetch_l2", "prefetch_spread",
                 "prefetch_kv", "huge_pages")  # decode_matvec.h
PREFILL_ROWS = cpu_tuning.prefill_rows()  # from this many rows on, the GEMM route (module doc): 32 or 256
FALLBACK_ROWS = 4096  # W rows dequantized at once by the fallback (bounds its fp32 temporary)
_state: dict = {}
ON_LOAD: list = []  # callables run once the extension has loaded (other ops' fake kernels: nn/ssm.py)


def _cpu_flags() -> set[str]:
    """The CPU's flags from /proc/cpuinfo (Linux), or none."""
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def instruction_set() -> str | None:
    """The first of INSTRUCTION_SETS ("avx512", "avx2") whose CPU flags this CPU lists, or None."""
    flags = _cpu_flags()
    return next((name for name, (needs, _) in INSTRUCTION_SETS.items() if needs <= flags), None)


def simde_directory() -> Path | None:
    """The include directory that holds SIMDe's AVX512 header (SIMDE_HEADER), or None: $CPATH's
    directories, then the simde-py package's, then the system's (SIMDE_DIRS)."""
    cpath = [d for d in os.environ.get("CPATH", "").split(os.pathsep) if d]
    dirs = [*cpath, simde_py.get_include(), *SIMDE_DIRS]
    return next((Path(d) for d in dirs if (Path(d) / SIMDE_HEADER).is_file()), None)


def compile_flags(isa: str) -> list[str]:
    """The compiler flags of the extension's build for the instruction set `isa` (the AVX2 build
    also names the directory of SIMDe's headers, so a version's build is tied to the headers it used)."""
    flags = FLAGS + INSTRUCTION_SETS[isa][1]
    simde = simde_directory() if isa == "avx2" else None
    return flags + ([f"-I{simde}"] if simde is not None else [])


def _extension_name(isa: str = "avx512") -> str:
    """The extension's name, with a digest of its sources, headers, flags and the directory they are
    in: each version builds in its own directory (torch's build cache does not see header changes,
    and checkouts of different versions on one machine must not rebuild over each other), and so
    does each checkout of one version (torch's build file names the sources by path: two checkouts
    sharing a directory rebuilt it, ~1 min, each time the other had loaded it)."""
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        digest.update(str(path.resolve()).encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(compile_flags(isa) + LDFLAGS).encode())
    return f"attnlab_kernels_{digest.hexdigest()[:12]}"


def build_directory(name: str) -> Path:
    """Where the extension `name` builds: $TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions, then
    py<major><minor>_cpu/<name>, the directory torch.utils.cpp_extension would choose itself."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / name


@contextmanager
def build_lock(directory: Path):
    """Hold an exclusive flock on directory/attnlab.lock around a build, released by the kernel when
    the process ends, however it ends.

    torch's own guard is a file (directory/lock) that exists while a build runs: a builder killed
    in the middle (kill -9, a paused job's timeout) leaves it behind, and every later load of that
    version then waits for it forever, silently. Every attnlab build holds this lock, so a `lock`
    file found while holding it belongs to no live build: it is removed, with a note on stderr.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "attnlab.lock", "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        baton = directory / "lock"
        if baton.exists():
            print(f"attnlab: removing {baton}, left by a kernel build that did not finish", file=sys.stderr)
            baton.unlink(missing_ok=True)
        yield


def _build() -> str | None:
    """Compile and load the extension; return None, or the reason it is not available."""
    if os.environ.get("ATTNLAB_QUANT_KERNEL", "") == "torch":
        return "ATTNLAB_QUANT_KERNEL=torch"
    isa = instruction_set()
    if isa is None:
        return "this CPU has neither AVX512-VNNI nor AVX2 with FMA and F16C"
    if isa == "avx2" and simde_directory() is None:  # the compiler finds it by itself there
        return (f"this CPU has no AVX512-VNNI; its AVX2 build needs SIMDe's headers ({SIMDE_HEADER}: "
                "pip install simde-py, apt-get install libsimde-dev, or put their directory on CPATH)")
    try:
        from torch.utils import cpp_extension  # optional: needs a C++ compiler and ninja at run time
        name = _extension_name(isa)
        directory = build_directory(name)
        with build_lock(directory):
            cpp_extension.load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=compile_flags(isa),
                               extra_ldflags=LDFLAGS, build_directory=str(directory),
                               is_python_module=False, verbose=False)
        _state["instruction_set"] = isa
        set_tuning(**cpu_tuning.kernel_settings(cpu_tuning.choose()))  # this machine's row (speed only)
        torch.library.register_fake("attnlab_quant::linear")(_fake)
        torch.library.register_fake("attnlab_quant::linear_f32")(_fake_f32)
        torch.library.register_fake("attnlab_quant::dequantize_bf16")(_fake_bf16)
        torch.library.register_fake("attnlab_quant::dequantize_f32")(_fake_f32_weight)
        for register in ON_LOAD:
            register()
    except Exception as err:  # any build or load failure: fall back, saying why
        return f"building {SOURCES[0].name} failed ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
    return None


def set_tuning(**values: int) -> None:
    """Set some of the extension's TUNING_FIELDS (decode_matvec.h's Tuning), the others kept.

    Raises:
        KeyError: an unknown field. RuntimeError: a value out of range (the extension's check).
    """
    current = get_tuning()
    for key in values:
        if key not in current:
            raise KeyError(f"unknown tuning field {key!r}; fields: {', '.join(TUNING_FIELDS)}")
    torch.ops.attnlab_quant.set_tuning([int({**current, **values}[k]) for k in TUNING_FIELDS])


def get_tuning() -> dict[str, int]:
    """The extension's current TUNING_FIELDS."""
    return dict(zip(TUNING_FIELDS, torch.ops.attnlab_quant.get_tuning()))


def _fake(x, qs, d, m, scheme, tile):
    return x.new_empty(x.shape[0], d.shape[0])


def _fake_f32(x, w):
    return x.new_empty(x.shape[0], w.shape[0])


def _fake_bf16(qs, d, m, scheme, tile):
    return d.new_empty(d.shape[0], d.shape[1] * BLOCK, dtype=torch.bfloat16)


def _fake_f32_weight(qs, d, m, scheme, tile):
    return d.new_empty(d.shape[0], d.shape[1] * BLOCK, dtype=torch.float32)


def built_for() -> str | None:
    """The instruction set ("avx512", "avx2") of the loaded extension, or None (the fallback)."""
    return _state.get("instruction_set") if kernel() == "cpp" else None


def kernel() -> str:
    """"cpp" when the C++ extension is built and loaded (building it at the first call), else "torch"."""
    if "name" not in _state:
        reason = _build()
        _state["name"] = "torch" if reason else "cpp"
        if reason:
            print(f"attnlab: quantized matmul uses the PyTorch fallback ({reason})", file=sys.stderr)
    return _state["name"]


def matmul_reference(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """The fallback: F.linear(dequantize(quantize_activations(x)), dequantize(W)), W in row slices
    (from PREFILL_ROWS rows on: the bf16 or fp32 product of the module doc, prefill_dtype).

    Args:
        x: (R, I) fp32. qw: an (O, I) QuantWeight.
    Returns:
        (R, O) fp32.
    """
    if x.shape[0] >= PREFILL_ROWS and cpu_tuning.prefill_dtype() == "bf16":
        return F.linear(x.to(torch.bfloat16), dequantize(qw).to(torch.bfloat16)).to(torch.float32)
    if x.shape[0] >= PREFILL_ROWS:
        return F.linear(x, dequantize(qw))
    q, d = quantize_activations(x)
    r, i = x.shape
    xd = (q.reshape(r, i // BLOCK, BLOCK).to(torch.float32) * d.unsqueeze(-1)).reshape(r, i)
    rows = qw.d.shape[0]
    return torch.cat([F.linear(xd, dequantize(qw, slice(s, s + FALLBACK_ROWS)))
                      for s in range(0, rows, FALLBACK_ROWS)], dim=-1)


def quant_matmul(x: torch.Tensor, qw: QuantWeight, impl: str | None = None) -> torch.Tensor:
    """y = x · Wᵀ for a block-quantized W, activations quantized per 32-block (module doc).

    Args:
        x: (..., I) float (computed in fp32). qw: an (O, I) QuantWeight, either layout (nn/quant.py).
        impl: "cpp", "torch", or None = the best available (kernel()).
    Returns:
        (..., O), x's dtype.
    Raises:
        ValueError: x's last dimension is not I, or impl is not one of the above.
    """
    out_features, in_features = qw.shape
    if x.shape[-1] != in_features:
        raise UserError(f"input has {x.shape[-1]} features, the quantized weight expects {in_features}")
    if impl not in (None, "cpp", "torch"):
        raise UserError(f"impl must be 'cpp', 'torch' or None, got {impl!r}")
    x2 = x.reshape(-1, in_features).to(torch.float32)
    use_cpp = (impl or kernel()) == "cpp" and x.device.type == "cpu" and (in_features // BLOCK) % 2 == 0
    if use_cpp and impl == "cpp" and kernel() != "cpp":
        raise UserError("the C++ quantized kernel is not available here")
    if use_cpp and x2.shape[0] >= PREFILL_ROWS and cpu_tuning.prefill_dtype() == "bf16":
        w = torch.ops.attnlab_quant.dequantize_bf16(qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme], qw.tile)
        y = F.linear(x2.to(torch.bfloat16), w).to(torch.float32)
    elif use_cpp and x2.shape[0] >= PREFILL_ROWS:
        y = F.linear(x2, torch.ops.attnlab_quant.dequantize_f32(qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme], qw.tile))
    elif use_cpp:
        y = torch.ops.attnlab_quant.linear(x2, qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme], qw.tile)
    else:
        y = matmul_reference(x2, qw)
    return y.reshape(*x.shape[:-1], out_features).to(x.dtype)
