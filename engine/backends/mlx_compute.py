"""The MLX backend's compute dtype per model: what its matrix products, attention and KV cache run in, and why.

The residual stream, embeddings, main norms and logits are float32 on every device (mlx/weights.py). What this
module chooses is the dtype of the rest. On MLX's CPU device that is float32 (its float16 kernels are an order of
magnitude slower). On the GPU float16 is the fast choice (quantized scales are float16, so products need no
conversions), but float16 holds at most 65504. A block output joins the float32 residual stream either straight
from a product (no post-norm: SmolLM2, Qwen2.5 and most models, whose products stay far below that) or, in models
with post-norms (Gemma 2 and 3), after an RMS norm whose output is bounded by ``sqrt(n_embd) * max |weight|``
(an RMS-normed vector has no element above ``sqrt(n_embd)``). That bound is read from the file at load (a few
small float vectors) and, where it passes 65504, the model computes in float32 instead. Measured in float32 on
the real test models: Gemma 3 270M's residual stream reaches 1.04e5, beyond float16, but it is float32 here; its
post-normed block outputs reach 19,866 against a bound of 41,919; SmolLM2's largest product output is 24,882.
tests/engine/test_parity.py's mlx-f16 variant holds each model's choice to llama.cpp's outputs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile, GGUFHeader
from ..ggml_types import GGMLQuantizationType
from ..model_tensors import layer_tensor_names

FLOAT16_MAX = 65504.0
DTYPES = ("float16", "bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class ComputeDtype:
    """The chosen dtype name (one of DTYPES) and the reason, in words a user reads in ``inspect`` and the dashboard."""

    name: str
    reason: str

    def __post_init__(self):
        if self.name not in DTYPES:
            raise ValueError(f"unknown MLX compute dtype {self.name!r} (choose from {', '.join(DTYPES)})")

    def describe(self) -> str:
        """One line: ``"float16 (reason)"``."""
        return f"{self.name} ({self.reason})"


def choose_compute_dtype(config: ModelConfig, on_gpu: bool, post_norm_bound: float | None = None) -> ComputeDtype:
    """The compute dtype of ``config``'s model on the MLX device (``on_gpu``: Metal, else MLX's CPU device).

    Args:
        config: the model's configuration.
        on_gpu: whether MLX computes on the GPU (``platform_mlx.default_device_is_gpu``).
        post_norm_bound: ``post_norm_bound(gguf, config)``, the most a post-normed block output can reach;
            None for a model without post-norms.

    Returns:
        The dtype and why it was chosen.
    """
    if not on_gpu:
        return ComputeDtype("float32", "MLX's CPU device is faster in float32 than in float16")
    if post_norm_bound is None:
        return ComputeDtype("float16", "the GPU's fast path; the residual stream stays float32")
    if post_norm_bound > FLOAT16_MAX:
        return ComputeDtype("float32", f"post-normed block outputs can reach {post_norm_bound:,.0f}, "
                                       f"beyond float16's {FLOAT16_MAX:,.0f}")
    return ComputeDtype("float16", f"post-normed block outputs stay within {post_norm_bound:,.0f}, below "
                                   f"float16's {FLOAT16_MAX:,.0f}; the residual stream stays float32")


def post_norm_bound(gguf: GGUFFile, config: ModelConfig) -> float | None:
    """The most any post-normed block output of the model can reach: ``sqrt(n_embd)`` times the largest
    magnitude among its post-norm weights; None when the model has no post-norms."""
    peak = None
    for name in _post_norm_tensors(gguf, config):
        peak = max(peak or 0.0, float(np.abs(_float_vector(gguf, name)).max()))
    return None if peak is None else math.sqrt(config.n_embd) * peak


def _post_norm_tensors(gguf: GGUFFile, config: ModelConfig):
    """The names of the model's post-norm weights, layer by layer."""
    for i in range(config.n_layers):
        for field, ref in layer_tensor_names(gguf, config, i).items():
            if ref is not None and field.startswith("post_") and "norm" in field:
                yield ref.name


def _float_vector(gguf: GGUFFile, name: str) -> np.ndarray:
    """A 1-D float tensor (a norm weight) as float32."""
    qtype, raw = gguf.tensor(name).qtype, gguf.raw(name).reshape(-1)
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32)
    from gguf.quants import dequantize  # here: the gguf package costs every process about 6 MB resident

    return dequantize(raw, qtype).astype(np.float32).reshape(-1)


def choose_for_file(gguf: GGUFFile, config: ModelConfig, on_gpu: bool) -> ComputeDtype:
    """``choose_compute_dtype`` for a model file: the post-norm bound read from it when the choice needs it.

    A header without tensor data (``GGUFHeader``: a Hub file judged before download) has no post-norm weights to
    read; a model with post-norms is then taken to compute in float32, the larger, so that a memory estimate made
    before the download never promises less than the load will take.
    """
    if on_gpu and isinstance(gguf, GGUFHeader) and next(_post_norm_tensors(gguf, config), None) is not None:
        return ComputeDtype("float32", "its post-norm weights are read only after the download; float32 assumed")
    return choose_compute_dtype(config, on_gpu, post_norm_bound(gguf, config) if on_gpu else None)


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # an element of each of DTYPES
