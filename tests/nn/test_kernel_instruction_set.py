"""Which build of the C++ extension a CPU gets (nn/quant_kernel.py INSTRUCTION_SETS): AVX512 where
every AVX512 flag is listed, AVX2 (through SIMDe) where only AVX2, FMA and F16C are, none otherwise;
a missing SIMDe named with the package that provides it; each build its own cached directory."""
from __future__ import annotations

from pathlib import Path

import simde_py

from attnlab.nn import quant_kernel

AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma", "avx2"}
ZEN3 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}  # AMD EPYC Zen 3: no AVX512


def test_each_cpu_gets_the_richest_build_it_runs(monkeypatch):
    for flags, want in [(AVX512, "avx512"), (ZEN3, "avx2"), (AVX512 - {"avx512_vnni"}, "avx2"),
                        ({"sse4_2", "avx"}, None), (set(), None)]:
        monkeypatch.setattr(quant_kernel, "_cpu_flags", lambda flags=flags: flags)
        assert quant_kernel.instruction_set() == want, flags


def test_the_builds_have_their_own_flags_and_names():
    assert "-mavx512vnni" in quant_kernel.compile_flags("avx512")
    avx2 = quant_kernel.compile_flags("avx2")
    assert "-mavx2" in avx2 and not any(f.startswith("-mavx512") for f in avx2)
    assert quant_kernel._extension_name("avx2") != quant_kernel._extension_name("avx512")


def test_an_avx2_cpu_without_simde_is_told_what_to_install(monkeypatch):
    monkeypatch.setattr(quant_kernel, "_cpu_flags", lambda: ZEN3)
    monkeypatch.setattr(quant_kernel, "simde_directory", lambda: None)
    monkeypatch.delenv("ATTNLAB_QUANT_KERNEL", raising=False)
    reason = quant_kernel._build()
    assert "libsimde-dev" in reason and "CPATH" in reason


def test_simde_is_found_on_cpath(monkeypatch, tmp_path):
    (tmp_path / "simde" / "x86").mkdir(parents=True)
    (tmp_path / quant_kernel.SIMDE_HEADER).write_text("")
    monkeypatch.setenv("CPATH", str(tmp_path))
    assert quant_kernel.simde_directory() == tmp_path


def test_simde_comes_with_the_package_and_its_directory_is_in_the_avx2_flags(monkeypatch):
    monkeypatch.delenv("CPATH", raising=False)
    monkeypatch.setattr(quant_kernel, "SIMDE_DIRS", ())
    found = quant_kernel.simde_directory()
    assert found == Path(simde_py.get_include()) and (found / quant_kernel.SIMDE_HEADER).is_file()
    assert f"-I{found}" in quant_kernel.compile_flags("avx2")
    assert not any(f.startswith("-I") for f in quant_kernel.compile_flags("avx512"))


def test_a_cpu_without_avx2_falls_back(monkeypatch):
    monkeypatch.setattr(quant_kernel, "_cpu_flags", lambda: {"sse4_2"})
    monkeypatch.delenv("ATTNLAB_QUANT_KERNEL", raising=False)
    assert "neither AVX512-VNNI nor AVX2" in quant_kernel._build()
