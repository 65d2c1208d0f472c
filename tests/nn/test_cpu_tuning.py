"""The per-machine choice of nn/cpu_tuning.py: a fixed rule on /proc/cpuinfo, the same at every call."""
import pytest

from attnlab.nn import cpu_tuning

AMD = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_vnni avx512_bf16\n"
INTEL = ("vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
         "flags\t\t: fpu avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n")


@pytest.mark.parametrize("text, row, amx", [(AMD, "amd", False), (INTEL, "intel", True)])
def test_the_row_follows_the_vendor(tmp_path, monkeypatch, text, row, amx):
    monkeypatch.delenv(cpu_tuning.ENV, raising=False)
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    info = cpu_tuning.cpu_info(str(path))
    assert info["flags"] == {"avx512_vnni": True, "avx512_bf16": True, "amx": amx}
    assert cpu_tuning.kind(info) == row and cpu_tuning.choose(info) == cpu_tuning.ROWS[row]
    assert cpu_tuning.linear_form(True, info) == cpu_tuning.ROWS[row].linear_form
    assert cpu_tuning.linear_form(False, info) == ("bmm" if row == "amd" else "blas")


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
