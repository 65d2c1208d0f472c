"""How this machine runs the decode products: a deterministic choice per CPU, never a timing.

The same arithmetic (every result bit for bit the same) streams weights at different rates on
different CPUs, so a few settings are chosen per CPU kind from /proc/cpuinfo, by a fixed rule:

    prefetch_q     how far ahead (weight bytes) a quantized tile's weights are prefetched
    prefetch_f32   the same for fp32 tiles (0 = the hardware prefetcher alone)
    parallel_bytes a thread's least share of one product's weights (smaller: run on one thread)
    one_region     1: the fused step runs in one parallel region with barriers (nn/decode_team.h);
                   0: each product and attention pass forks and joins the threads itself
    prefetch_l2    1: prefetches go to L2 only (more misses in flight than L1 allows), 0: into L1
    prefetch_spread 1: a quantized 16/8-row tile asks for the tile ahead a few lines per block while
                   it runs; 0: all its lines at once before it (a burst fills the miss queues and stalls)
    prefetch_kv    attention's next kv head's cache rows: 0 left to the hardware prefetcher, 1 all
                   asked for before the current head's pass, 2 a few per key of it
    huge_pages     1: the fused step's plan moves the weights it streams onto 2 MiB pages when it is
                   built (nn/huge_pages.h, MADV_COLLAPSE; where Linux cannot, they stay on 4 KiB)
    linear_form    how nn/linear.py computes a few-row fp32 product: "cpp" (decode_matvec.h's
                   AVX512 kernel, where the extension builds), "bmm" (a batched product over 4 row
                   blocks) or "blas" (F.linear); results agree up to fp32 summation order
    tile_q8_0, tile_q4_0, tile_q4_1
                   the layout a quantized weight is prepared in for the kernel, per format
                   (nn/quant.py QuantWeight.tile, made once by nn/quant_linear.py prepare): 0 = ggml's
                   rows (4-row tiles), 16 / 8 = the kernel's 16- / 8-row tiles (nn/quant_tiles.h).
                   16 and 8 give the same bits; 0 adds in another order (results agree up to fp32
                   summation order). Never chosen by the batch size: a sequence decoded in a batch
                   keeps the bits it gets alone.

Where a value came from (bench/decode_tuning.py runs the sweeps; the README keeps the tables):
    Intel (GenuineIntel; Sapphire Rapids, issue 17's host): prefetch_q 3072 (1.3-2× on Q8_0 / Q4_1),
        no fp32 prefetch (no gain), parallel_bytes 32 KiB (issue 17's sweeps). Measured there on
        2026-12-06: the 16-row tiles for every format (`python bench/quant_tiles.py --precisions q8_0
        q4_1 q4_0 --configs 0 16 8 --batches 1 8 --rounds 3 --steps 10`, bench/results/
        quant_tiles_intel_spr.json: 1.15-1.26x ggml's rows at B = 1, 1.24-1.66x at B = 8; 8 rows
        between) and the one-region step (`ATTNLAB_QUANT_TILE=16 python bench/decode_tuning.py
        --dtypes auto q8_0 --rounds 3 --steps 10 --context 200 --candidates '' one_region=1 ...`,
        bench/results/decode_tuning_intel_spr.json: B = 1 steps 1.02-1.07x, B = 8 1.02x faster than a
        fork/join per product); the spread prefetches lost there at B = 1 (0.84-0.90x), so the bursts stay.
    AMD without AVX512 (AuthenticAMD, no avx512f: EPYC Zen 2/3; the extension's AVX2 build, whose 16-lane
        vectors SIMDe emulates as pairs of 8-lane ones): AMD_AVX2, Zen 4's row with the 8-row tiles,
        which keep a tile's weights and accumulators in the 16 AVX2 registers. Measured on an EPYC Zen 3
        on 2026-12-07 (`python bench/quant_tiles.py --precisions q8_0 q4_1 q4_0 --configs 0 16 8
        --batches 1 8 --rounds 3 --steps 10`, bench/results/quant_tiles_amd_epyc_zen3.json): 8 rows
        1.27x / 1.72x / 2.64x the 16-row tiles at B = 1 (Q8_0 / Q4_1 / Q4_0) and 4.9x / 2.6x / 1.9x
        at B = 8, where the 16-row tiles spilled (Q8_0 B = 8 ran at 0.39x its B = 1 tokens/s); and no
        fp32 prefetch (`python bench/decode_tuning.py --dtypes fp32 q8_0 --rounds 3 --steps 10 --context
        200 --candidates '' prefetch_f32=0 ...`, bench/results/decode_tuning_amd_epyc_zen3.json: the fp32
        step 1.20x faster at B = 1; after the fp32 product moved to native 8-lane vectors, lanes.h,
        decode_tuning_amd_epyc_zen3_f32lanes.json: 1.03x); the quantized settings were best as Zen 4's.
    AMD (AuthenticAMD with AVX512; EPYC Zen 4, issue 23's host): see AMD_ZEN4 below.
        The tiles: AMD 16 rows for every format (bench/quant_tiles.py, bench/results/
        quant_tiles_amd_epyc.json: 1.06-1.14x the rows at B = 1, 1.3-1.6x at B = 8; 8 rows no better);
        Spread prefetches (prefetch_spread 1, prefetch_kv 2): `python bench/decode_tuning.py --dtypes
        auto q8_0 --rounds 5 --steps 10 --context 200 --candidates '' prefetch_spread=0,prefetch_kv=1
        prefetch_spread=0,prefetch_kv=0 prefetch_spread=0,prefetch_kv=2 prefetch_spread=1,prefetch_kv=1
        prefetch_spread=1,prefetch_kv=0` (bench/results/decode_tuning_spread_amd_epyc.json): the bursts
        stalled the step (perf: the samples on the instruction after each prefetcht1); spread, B = 1 / 8
        steps 1.11-1.15x / 1.16-1.23x faster than the bursts. fp32
        keeps its burst (spread or none: 1.2x slower at B = 1, bandwidth-bound).
    AMD EPYC Zen 5 (CPU family 26, AVX512): the same row. Measured there on 2026-12-07 (`python
        bench/quant_tiles.py --precisions q8_0 q4_1 q4_0 --configs 0 16 8 16:0 16:8192 --batches 1 8
        --rounds 3 --steps 10`, bench/results/quant_tiles_amd_epyc_zen5.json: 16-row tiles 1.08x / 1.66x
        / 1.25x the rows at B = 8, 8 rows no better; bench/decode_tuning.py's prefetch candidates,
        bench/results/decode_tuning_amd_epyc_zen5.json: none better at B = 1 and B = 8 for every format).
    huge_pages 1 in every row: measured on an EPYC Zen 3 on 2026-12-07 (`python bench/huge_pages.py
        --rounds 10`, bench/results/huge_pages_amd_epyc_zen3.json: two copies of SmolLM2-135M decoding
        in turns, huge / 4 KiB pages 1.06x fp32, 1.07x Q8_0, 1.01x Q4_0, medians of 10 rounds whose
        spreads reach below 1; an earlier run 1.08x / 1.06x / 1.05x); the first plan build pays the
        collapse once, 0.3-1.9 s. Not measured on Intel or Zen 4, where it is on for the same reason
        (a stream of hundreds of MB crosses a 4 KiB page every 64 cache lines).
The chosen values are printed in every bench JSON (`chosen()`), ATTNLAB_CPU_TUNING=intel|amd|amd_avx2
forces one kind's row and ATTNLAB_QUANT_TILE=0|8|16 one tile for every format (to compare them on one
machine; read when a weight is prepared).
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab.errors import UserError
ENV = "ATTNLAB_CPU_TUNING"  # "intel" / "amd" / "amd_avx2": use that kind's row whatever this CPU is
TILE_ENV = "ATTNLAB_QUANT_TILE"  # "0" / "8" / "16": that layout for every format (module doc)
TILES = (0, 8, 16)  # = nn/quant.py TILES


@dataclass(frozen=True)
class Tuning:
    prefetch_q: int       # bytes; 0 = none
    prefetch_f32: int     # bytes; 0 = none
    parallel_bytes: int   # bytes
    one_region: int       # 1 or 0 (module doc)
    prefetch_l2: int      # 1 or 0 (module doc)
    linear_form: str      # "cpp", "bmm" or "blas" (module doc)
    prefetch_spread: int = 0  # 1 or 0 (module doc)
    prefetch_kv: int = 1      # 0, 1 or 2 (module doc)
    huge_pages: int = 1       # 1 or 0 (module doc)
    tile_q8_0: int = 0    # rows per kernel tile of a prepared weight, per format: 0, 8 or 16 (module doc)
    tile_q4_0: int = 0
    tile_q4_1: int = 0


INTEL_SPR = Tuning(prefetch_q=3072, prefetch_f32=0, parallel_bytes=1 << 15, one_region=1, prefetch_l2=0,
                   linear_form="cpp", tile_q8_0=16, tile_q4_0=16, tile_q4_1=16)
AMD_ZEN4 = Tuning(prefetch_q=4096, prefetch_f32=16384, parallel_bytes=1 << 15, one_region=1, prefetch_l2=1,
                  linear_form="cpp", prefetch_spread=1, prefetch_kv=2, tile_q8_0=16, tile_q4_0=16, tile_q4_1=16)
AMD_AVX2 = Tuning(prefetch_q=4096, prefetch_f32=0, parallel_bytes=1 << 15, one_region=1, prefetch_l2=1,
                  linear_form="cpp", prefetch_spread=1, prefetch_kv=2, tile_q8_0=8, tile_q4_0=8, tile_q4_1=8)
ROWS = {"intel": INTEL_SPR, "amd": AMD_ZEN4, "amd_avx2": AMD_AVX2}
NOT_KERNEL = ("linear_form", "tile_q8_0", "tile_q4_0", "tile_q4_1")  # chosen in Python, not set in the extension


def kernel_settings(row: Tuning) -> dict[str, int]:
    """The row's values the C++ extension takes (nn/quant_kernel.py set_tuning)."""
    return {k: v for k, v in asdict(row).items() if k not in NOT_KERNEL}


def quant_tile(scheme: str, info: dict | None = None) -> int:
    """The kernel layout this machine prepares a `scheme` weight in (module doc): 0, 8 or 16;
    ATTNLAB_QUANT_TILE overrides (a bad value is named)."""
    forced = os.environ.get(TILE_ENV, "")
    if forced:
        if forced not in map(str, TILES):
            raise UserError(f"{TILE_ENV}={forced!r}: must be one of {', '.join(map(str, TILES))}")
        return int(forced)
    return getattr(choose(info), f"tile_{scheme}")


CPUINFO = "/proc/cpuinfo"


def cpu_info(path: str = CPUINFO) -> dict:
    """{"vendor", "model_name", "flags": {avx512f, avx512_vnni, avx512_bf16, amx}} of this CPU ("" / False
    where /proc/cpuinfo does not say). This machine's file is read once per process (the CPU does
    not change under it; nn/linear.py asks on every few-row product); each call gets its own copy."""
    info = _this_machine() if path == CPUINFO else _read_info(path)
    return {**info, "flags": dict(info["flags"])}


@functools.cache
def _this_machine() -> dict:
    return _read_info(CPUINFO)


def _read_info(path: str) -> dict:
    fields: dict[str, str] = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"vendor": fields.get("vendor_id", ""), "model_name": fields.get("model name", ""),
            "flags": {"avx512f": "avx512f" in flags, "avx512_vnni": "avx512_vnni" in flags,
                      "avx512_bf16": "avx512_bf16" in flags,
                      "amx": bool({"amx_tile", "amx_int8", "amx_bf16"} & flags)}}


def native_bf16(info: dict | None = None) -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX): where recipes train
    under bf16 autocast by default (TrainConfig.autocast)."""
    flags = (info or cpu_info())["flags"]
    return flags["avx512_bf16"] or flags["amx"]


def prefill_dtype(info: dict | None = None) -> str:
    """The dtype of a quantized weight's many-row (prefill) product here (nn/quant_kernel.py): "bf16"
    where the CPU multiplies bf16 natively (native_bf16: oneDNN's bf16 GEMM, AMX where present,
    about 1.8x the int8 kernel at 64 rows), else "fp32" (on AMD EPYC Zen 3, without AVX512-BF16,
    oneDNN emulates bf16 products and the bf16 route prefilled SmolLM2 Q8_0 at 0.19x llama.cpp)."""
    return "bf16" if native_bf16(info) else "fp32"


def prefill_rows(info: dict | None = None) -> int:
    """From how many rows a quantized weight's product leaves the int8 kernel for the GEMM route of
    prefill_dtype (nn/quant_kernel.py PREFILL_ROWS): 32 where bf16 is native; 256 elsewhere, where
    the fp32 route must first dequantize the weight in fp32 and the int8 kernel stays ahead up to
    about that many (`python bench/prefill_route.py --tokens 32 64 128 256 512 --rounds 3`,
    bench/results/prefill_route_amd_epyc_zen3.json, SmolLM2 on Zen 3: the int8 kernel 2.1-2.7x the
    fp32 route at 32 tokens, 1.3-1.6x at 128, 1.03x at 256, 0.84-0.90x at 512)."""
    return 32 if native_bf16(info) else 256


def kind(info: dict | None = None) -> str:
    """"amd" for an AuthenticAMD CPU with AVX512, "amd_avx2" for one without, else "intel" (the rule's
    default row); ATTNLAB_CPU_TUNING overrides."""
    forced = os.environ.get(ENV, "")
    if forced:
        if forced not in ROWS:
            raise UserError(f"{ENV}={forced!r}: must be one of {', '.join(ROWS)}")
        return forced
    info = info or cpu_info()
    if info["vendor"] != "AuthenticAMD":
        return "intel"
    return "amd" if info["flags"].get("avx512f", True) else "amd_avx2"


def choose(info: dict | None = None) -> Tuning:
    """This machine's row of the rule (module doc): the same answer at every call."""
    return ROWS[kind(info)]


def chosen(kernel_built: bool) -> dict:
    """What a bench JSON records: the CPU, the row chosen and its values (linear_form as it will
    run: "cpp" needs the extension, else "bmm" on AMD and "blas" elsewhere) and the dtype of the
    quantized prefill product (prefill_dtype) and the rows it starts at (prefill_rows)."""
    info = cpu_info()
    row = choose(info)
    tiles = {f"tile_{s}": quant_tile(s, info) for s in ("q8_0", "q4_0", "q4_1")}
    return {"cpu": info, "tuning_row": kind(info), **asdict(row), "linear_form": linear_form(kernel_built, info),
            **tiles, "prefill_dtype": prefill_dtype(info), "prefill_rows": prefill_rows(info)}


def linear_form(kernel_built: bool, info: dict | None = None) -> str:
    """The few-row fp32 product nn/linear.py runs here (module doc)."""
    row = choose(info)
    if row.linear_form == "cpp" and not kernel_built:
        return "bmm" if kind(info).startswith("amd") else "blas"
    return row.linear_form
