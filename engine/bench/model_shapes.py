"""The real shapes of the models the bench writes, and the per-tensor types of each file type (llama.cpp's mixes).

The shapes are the published configurations of each model (layers, widths, heads, vocabulary family, RoPE);
weights are random, since speed does not depend on their values. A file type maps each tensor to a GGML type
the way ``llama-quantize`` does for these dense models: the ``_M`` K-quant mixes give ``attn_v`` and ``ffn_down``
more bits on the layers llama.cpp's ``use_more_bits`` picks and the output matrix (or a tied embedding) Q6_K;
a plain type (Q8_0, Q4_0, IQ4_XS, MXFP4, ...) is used for every matrix, with a Q6_K output as llama.cpp writes
it (Q8_0 keeps Q8_0). Norms, biases and RoPE factors stay F32.
"""

from __future__ import annotations

import dataclasses

from ..ggml_types import GGMLQuantizationType as Q


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One model's architecture as the GGUF metadata and tensor shapes carry it."""

    arch: str  # llama | qwen2 | qwen3
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    rope_base: float
    n_ctx_train: int
    rms_eps: float
    vocab_pre: str  # tokenizer.ggml.pre of the vocabulary the model ships with
    llama3_rope: tuple[float, float, float, int] | None = None  # factor, low/high freq factors, original context


LLAMA3_2 = (32.0, 1.0, 4.0, 8192)
SHAPES: dict[str, ModelShape] = {
    "Llama-3.2-1B": ModelShape("llama", 16, 2048, 8192, 32, 8, 64, True, 500000.0, 131072, 1e-5, "llama-bpe",
                               LLAMA3_2),
    "Qwen2.5-1.5B": ModelShape("qwen2", 28, 1536, 8960, 12, 2, 128, True, 1e6, 32768, 1e-6, "qwen2"),
    "Qwen3-1.7B": ModelShape("qwen3", 28, 2048, 6144, 16, 8, 128, True, 1e6, 40960, 1e-6, "qwen2"),
    "Llama-3.2-3B": ModelShape("llama", 28, 3072, 8192, 24, 8, 128, True, 500000.0, 131072, 1e-5, "llama-bpe",
                               LLAMA3_2),
    "Qwen3-4B": ModelShape("qwen3", 36, 2560, 9728, 32, 8, 128, True, 1e6, 40960, 1e-6, "qwen2"),
    "Llama-3.1-8B": ModelShape("llama", 32, 4096, 14336, 32, 8, 128, False, 500000.0, 131072, 1e-5, "llama-bpe",
                               (8.0, 1.0, 4.0, 8192)),
}
REAL_MODELS = tuple(SHAPES)
# Small shapes with the same structure, for the writer's own tests (every width a multiple of 256 for K-quants).
SHAPES["tiny-qwen3"] = ModelShape("qwen3", 2, 256, 512, 4, 2, 64, True, 1e6, 4096, 1e-6, "qwen2")
SHAPES["tiny-llama"] = ModelShape("llama", 2, 256, 512, 4, 2, 64, False, 500000.0, 4096, 1e-5, "llama-bpe",
                                  LLAMA3_2)

STANDARD_TYPES = ("Q4_K_M", "Q8_0", "Q4_0")
# The types issue 19 added, written for Qwen3-1.7B by default.
ISSUE19_TYPES = ("Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4", "IQ3_S", "IQ3_XXS", "IQ2_XXS",
                 "IQ2_XS", "IQ2_S")
FILE_TYPES = STANDARD_TYPES + ISSUE19_TYPES

# file type -> (the type of most matrices, the output's type)
_BASE = {
    "Q4_K_M": (Q.Q4_K, Q.Q6_K), "Q5_K_M": (Q.Q5_K, Q.Q6_K), "Q3_K_M": (Q.Q3_K, Q.Q6_K), "Q2_K": (Q.Q2_K, Q.Q6_K),
    "Q6_K": (Q.Q6_K, Q.Q6_K), "Q8_0": (Q.Q8_0, Q.Q8_0), "Q4_0": (Q.Q4_0, Q.Q6_K), "IQ4_NL": (Q.IQ4_NL, Q.Q6_K),
    "IQ4_XS": (Q.IQ4_XS, Q.Q6_K), "MXFP4": (Q.MXFP4, Q.Q6_K), "IQ3_S": (Q.IQ3_S, Q.Q6_K),
    "IQ3_XXS": (Q.IQ3_XXS, Q.Q6_K), "IQ2_XXS": (Q.IQ2_XXS, Q.Q6_K), "IQ2_XS": (Q.IQ2_XS, Q.Q6_K),
    "IQ2_S": (Q.IQ2_S, Q.Q6_K),
}


def default_types(model: str) -> tuple[str, ...]:
    """The file types written for ``model`` when none are asked for."""
    return FILE_TYPES if model == "Qwen3-1.7B" else STANDARD_TYPES


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits in the _M mixes: the first and last eighth, every third."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_type(file_type: str, role: str, layer: int, n_layers: int) -> Q:
    """The GGML type of one matrix.

    Args:
        file_type: one of FILE_TYPES.
        role: ``output`` (also a tied embedding), ``token_embd``, or the layer tensor's name (``attn_v``, ...).
        layer: the block index (ignored for output and embedding).
    """
    if file_type not in _BASE:
        raise ValueError(f"unknown file type {file_type!r}; known: {', '.join(FILE_TYPES)}")
    base, output = _BASE[file_type]
    if role == "output":
        return output
    if role == "token_embd":
        return base
    more = use_more_bits(layer, n_layers)
    if file_type in ("Q4_K_M", "Q5_K_M") and role in ("attn_v", "ffn_down") and more:
        return Q.Q6_K
    if file_type == "Q3_K_M":
        if role == "attn_v":
            return Q.Q5_K if layer < 2 else Q.Q4_K
        if role == "ffn_down":
            return Q.Q5_K if layer < n_layers // 16 else Q.Q4_K if more else Q.Q3_K
        if role == "attn_output":
            return Q.Q4_K
    if file_type == "Q2_K" and role in ("attn_v", "ffn_down"):
        return Q.Q3_K
    return base
