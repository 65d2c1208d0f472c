"""One source for the block formats: the ids Python passes to the C++ kernels are the C++ enums, and
the GGUF type ids and block sizes are ggml's (as the gguf package lists them)."""
import pytest
import torch

from attnlab.interop.gguf_quants import BLOCK_BYTES, GGML_TYPE, TYPES
from attnlab.nn.fused_decode import F32
from attnlab.nn.quant import BLOCK, SCHEMES
from attnlab.nn.quant_kernel import SCHEME_ID, kernel


@pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here (nn/quant_kernel.py)")
def test_python_kind_ids_equal_the_cpp_enums():
    assert torch.ops.attnlab_decode.weight_kinds() == [SCHEME_ID[s] for s in SCHEMES] + [F32]
    assert list(SCHEME_ID) == list(SCHEMES)


def test_gguf_type_ids_and_block_bytes_are_ggmls():
    gguf = pytest.importorskip("gguf", reason="needs the gguf package (pip install 'attnlab[hf]')")
    for scheme in SCHEMES:
        kind = gguf.GGMLQuantizationType[scheme.upper()]
        assert GGML_TYPE[scheme] == int(kind)
        assert gguf.GGML_QUANT_SIZES[kind] == (BLOCK, BLOCK_BYTES[scheme])
        assert TYPES[int(kind)] == (kind.name, BLOCK_BYTES[scheme])
    for name in ("F32", "F16", "BF16"):
        kind = gguf.GGMLQuantizationType[name]
        assert TYPES[int(kind)] == (name, gguf.GGML_QUANT_SIZES[kind][1])
