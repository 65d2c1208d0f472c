"""The per-machine choice of nn/cpu_tuning.py: a fixed rule on /proc/cpuinfo, the same at every call."""
import pytest
import torch

from attnlab.nn import cpu_tuning, quant_kernel
from attnlab.nn import linear as fast_linear

AMD = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_vnni avx512_bf16\n"
INTEL = ("vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
         "flags\t\t: fpu avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n")


ZEN3 = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma f16c\n"


@pytest.mark.parametrize("text, row, avx512, amx", [(AMD, "amd", True, False), (INTEL, "intel", True, True),
                                                    (ZEN3, "amd_avx2", False, False)])
def test_the_row_follows_the_vendor_and_avx512(tmp_path, monkeypatch, text, row, avx512, amx):
    monkeypatch.delenv(cpu_tuning.ENV, raising=False)
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    info = cpu_tuning.cpu_info(str(path))
    assert info["flags"] == {"avx512f": avx512, "avx512_vnni": avx512, "avx512_bf16": avx512, "amx": amx}
    assert cpu_tuning.kind(info) == row and cpu_tuning.choose(info) == cpu_tuning.ROWS[row]
    assert cpu_tuning.linear_form(True, info) == cpu_tuning.ROWS[row].linear_form
    assert cpu_tuning.linear_form(False, info) == ("bmm" if row.startswith("amd") else "blas")


def test_cpus_without_avx512_take_the_8_row_tiles(tmp_path, monkeypatch):
    """Zen 3's row: the AVX2 build's 16-row tiles spill (bench/results/quant_tiles_amd_epyc_zen3.json)."""
    monkeypatch.delenv(cpu_tuning.TILE_ENV, raising=False)
    monkeypatch.delenv(cpu_tuning.ENV, raising=False)
    path = tmp_path / "cpuinfo"
    path.write_text(ZEN3)
    info = cpu_tuning.cpu_info(str(path))
    assert [cpu_tuning.quant_tile(s, info) for s in ("q8_0", "q4_0", "q4_1")] == [8, 8, 8]


def test_the_choice_is_deterministic_and_recorded(monkeypatch):
    monkeypatch.delenv(cpu_tuning.ENV, raising=False)
    first = cpu_tuning.chosen(True)
    assert cpu_tuning.chosen(True) == first
    assert first["tuning_row"] in cpu_tuning.ROWS and first["cpu"] == cpu_tuning.cpu_info()
    assert {"prefetch_q", "prefetch_f32", "parallel_bytes", "linear_form"} <= set(first)


def test_the_environment_forces_a_row_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(cpu_tuning.ENV, "intel")
    assert cpu_tuning.choose() == cpu_tuning.INTEL_SPR
    monkeypatch.setenv(cpu_tuning.ENV, "arm")
    with pytest.raises(ValueError, match="ATTNLAB_CPU_TUNING='arm': must be one of intel, amd"):
        cpu_tuning.choose()


def test_this_machine_is_read_once(monkeypatch):
    """Regression: nn/linear.py asked cpu_tuning for its backward-capable form on every few-row
    product with a gradient, and each ask read /proc/cpuinfo again."""
    reads = []
    real = cpu_tuning._read_info
    monkeypatch.setattr(cpu_tuning, "_read_info", lambda path: reads.append(path) or real(path))
    cpu_tuning._this_machine.cache_clear()
    x = torch.randn(2, 8, requires_grad=True)
    weight = torch.randn(12, 8)
    for _ in range(5):
        fast_linear.linear(x, weight).sum().backward()
    first = cpu_tuning.cpu_info()
    first["flags"]["amx"] = "changed by a caller"
    assert reads.count(cpu_tuning.CPUINFO) <= 1
    assert cpu_tuning.cpu_info()["flags"]["amx"] in (True, False)  # each call its own copy


@pytest.mark.parametrize("text, dtype, rows", [(AMD, "bf16", 32), (INTEL, "bf16", 32), (ZEN3, "fp32", 256)])
def test_the_quantized_prefill_product_is_bf16_only_where_bf16_is_native(tmp_path, text, dtype, rows):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    info = cpu_tuning.cpu_info(str(path))
    assert cpu_tuning.prefill_dtype(info) == dtype and cpu_tuning.prefill_rows(info) == rows
    chosen = cpu_tuning.chosen(True)  # this machine's, recorded
    assert (chosen["prefill_dtype"], chosen["prefill_rows"]) == (cpu_tuning.prefill_dtype(), quant_kernel.PREFILL_ROWS)
