"""The engine's GGML type table against the gguf package's."""

import gguf

from engine.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType


def test_every_type_has_the_gguf_packages_id_and_block_sizes():
    ours = {t.name: (t.value, GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}
    theirs = {t.name: (t.value, gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType
              if t in gguf.GGML_QUANT_SIZES}
    assert ours == theirs


def test_members_mix_with_the_gguf_packages_own():
    """Code that still holds gguf's enum (the CPU kernels, the dequantizer) looks ours up and compares equal."""
    assert GGMLQuantizationType.Q4_K == gguf.GGMLQuantizationType.Q4_K
    assert gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q6_K] == (256, 210)
    assert GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0] == (32, 34)
