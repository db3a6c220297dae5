"""Rotary position embedding tables, computed once per model exactly as ggml's ``rope_yarn`` does.

Every backend rotates queries and keys with the same two things: per-dimension inverse frequencies of one
of a few *sets* (the global layers' and, where it differs, the sliding-window layers'), and one magnitude
factor ``ModelConfig.rope_mscale`` multiplying cos and sin. Everything an architecture or a GGUF's
metadata asks for is folded into those numbers here:

- linear scaling: positions divided by ``rope_scale`` = the inverse frequency divided by it;
- Llama-3 ``rope_freqs`` and LongRoPE ``rope_factors_long``/``rope_factors_short``: ggml divides each
  dimension's frequency by the factor;
- YaRN: ggml blends the interpolated frequency (``freq_scale * theta``) and the extrapolated one
  (``theta``) with a per-dimension ramp, ``theta * (freq_scale * (1 - ramp) + ramp)``: a per-dimension
  factor on the inverse frequency; its magnitude correction goes to ``rope_mscale`` (``yarn_mscale``).

A layer's angle for position ``p`` and dimension pair ``i`` is ``p * inv_freq[set, i]``; cos and sin are
then multiplied by ``rope_mscale``. Layers without RoPE (smollm3's every fourth, granite with
``rope.scaling.finetuned`` false) have set -1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .ggml_types import GGMLQuantizationType
from .gguf_file import GGUFFile, ModelFormatError

if TYPE_CHECKING:
    from .config import ModelConfig

LLAMA_CTX_PAD = 256  # llama.cpp rounds a context's size up to a multiple of this (llama-context.cpp)


def rope_tables(gguf: GGUFFile, config: ModelConfig, n_ctx: int | None = None) -> tuple[np.ndarray, list[int]]:
    """The effective RoPE inverse frequencies of every set, and each layer's set.

    Args:
        gguf: the model file (for the ``rope_freqs`` / ``rope_factors_*`` tensors).
        config: the model's hyper-parameters.
        n_ctx: the context size the model is loaded for. It only matters for LongRoPE models, where
            llama.cpp takes ``rope_factors_long`` when the context (rounded up to a multiple of 256, as
            llama.cpp rounds it) exceeds ``rope.scaling.original_context_length``, else
            ``rope_factors_short``. None means a context within the original one (short factors).

    Returns:
        ``(inv_freq, layer_set)``: inv_freq float64 of shape (n_sets, rope_dim // 2) (a list of rows where the
        sliding layers rotate fewer dimensions, gemma4's ``rope_dim_swa``); layer_set, per
        layer, the row of ``inv_freq`` it rotates with, or -1 for a layer without RoPE.
    """
    factors = _frequency_factors(gguf, config, n_ctx)
    global_set = _inv_freq(config, config.rope_base, config.rope_scale, factors)
    local_set = _inv_freq(config, config.layer_rope_base(_first_sliding(config)), config.local_rope_scale, None,
                          config.rope_dim_swa or config.rope_dim)
    sets = [global_set]
    layer_set = []
    for il in range(config.n_layers):
        if not config.is_rope_layer(il):
            layer_set.append(-1)
            continue
        if config.is_sliding(il) and not np.array_equal(local_set, global_set):
            if len(sets) == 1:
                sets.append(local_set)
            layer_set.append(1)
        else:
            layer_set.append(0)
    if len({s.shape for s in sets}) > 1:  # gemma4: the sliding layers rotate fewer dimensions
        return sets, layer_set
    return np.stack(sets), layer_set


def yarn_mscale(config: ModelConfig, freq_scale: float | None = None) -> float:
    """The magnitude factor on cos and sin (ggml's mscale) for layers rotated with ``freq_scale``.

    llama.cpp (llama-context.cpp) sets ``attn_factor`` from the YaRN factor, ``yarn_log_multiplier`` and
    ``rope.scaling.attn_factor``; ggml's ``rope_yarn`` multiplies it by ``1 + 0.1 ln(1 / freq_scale)``
    when YaRN extrapolation is on. Computed in float32 as llama.cpp does.
    """
    f32 = np.float32
    attn_factor = f32(1.0)
    if config.rope_scaling == "yarn":
        factor = f32(config.rope_scale)

        def get_mscale(scale, mscale):
            return f32(1.0) if scale <= 1.0 else f32(f32(0.1) * f32(mscale) * np.log(scale) + f32(1.0))

        if config.yarn_log_mul != 0.0:
            attn_factor = f32(get_mscale(factor, 1.0) / get_mscale(factor, config.yarn_log_mul))
        else:
            attn_factor = get_mscale(factor, 1.0)
        attn_factor = f32(attn_factor * f32(f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor))))
    attn_factor = f32(attn_factor * f32(config.rope_attn_factor))
    if config.rope_scaling == "yarn":
        scale = f32(1.0 / (config.rope_scale if freq_scale is None else freq_scale))
        attn_factor = f32(attn_factor * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / scale)))
    return float(attn_factor)


def attn_temperature(config: ModelConfig, positions: np.ndarray) -> np.ndarray:
    """Per-position query multipliers of llama4/mistral3 temperature tuning, float32 (n,).

    llama.cpp (``llm_graph_input_attn_temp``): ``log(floor(pos / floor_scale) + 1) * temp_scale + 1``,
    with the position offset 0 that mistral3 uses. All ones when ``attn_temp_scale`` is 0.
    """
    pos = np.asarray(positions, dtype=np.float32)
    if config.attn_temp_scale == 0.0:
        return np.ones(pos.shape, np.float32)
    steps = np.floor(pos / np.float32(config.attn_temp_floor)).astype(np.float64)
    return (np.log(steps + 1.0) * config.attn_temp_scale + 1.0).astype(np.float32)


def _first_sliding(config: ModelConfig) -> int:
    return next((il for il in range(config.n_layers) if config.is_sliding(il)), 0)


def _inv_freq(config: ModelConfig, base: float, scale: float, factors: np.ndarray | None,
              n_dims: int | None = None) -> np.ndarray:
    """ggml's per-dimension theta for position 1: base^(-2i/d) / factor, then linear or YaRN scaling."""
    n_dims = n_dims or config.rope_dim
    inv_freq = base ** (-np.arange(0, n_dims, 2, dtype=np.float64) / n_dims)  # (rope_dim // 2,)
    if factors is not None:
        inv_freq = inv_freq / factors
    freq_scale = 1.0 / scale
    if config.rope_scaling != "yarn":
        return inv_freq * freq_scale
    low, high = yarn_corr_dims(n_dims, config.yarn_orig_ctx, base, config.yarn_beta_fast, config.yarn_beta_slow)
    i = np.arange(n_dims // 2, dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)  # ext_factor is 1 for YaRN
    return inv_freq * (freq_scale * (1.0 - ramp) + ramp)


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the first and last dimension of YaRN's ramp (float32 as in ggml)."""
    def corr_dim(n_rot: float) -> np.float32:
        return np.float32(n_dims * np.log(np.float32(n_ctx_orig / (n_rot * 2 * math.pi)), dtype=np.float32)
                          / (2 * np.log(np.float32(base), dtype=np.float32)))
    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


def _frequency_factors(gguf: GGUFFile, config: ModelConfig, n_ctx: int | None) -> np.ndarray | None:
    """The per-dimension divisors llama.cpp's ``get_rope_factors`` picks: rope_freqs, else long/short."""
    names = ["rope_freqs.weight"]
    if config.rope_factors:
        long_ctx = n_ctx is not None and -(-n_ctx // LLAMA_CTX_PAD) * LLAMA_CTX_PAD > config.yarn_orig_ctx
        names.append("rope_factors_long.weight" if long_ctx else "rope_factors_short.weight")
    for name in names:
        if name in gguf.tensors:
            return _vector(gguf, name, config.rope_dim // 2)
    return None


def _vector(gguf: GGUFFile, name: str, length: int) -> np.ndarray:
    info = gguf.tensor(name)
    if info.shape != (length,):
        raise ModelFormatError(f"tensor {name!r} has shape {info.shape}, expected ({length},)")
    raw = gguf.raw(name)
    if info.qtype == GGMLQuantizationType.F32:
        values = raw.view(np.float32)
    else:  # a quantized factor vector: rare, and the gguf package costs every process about 6 MB resident
        from gguf.quants import dequantize
        values = dequantize(raw, info.qtype)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ModelFormatError(f"tensor {name!r} holds a factor that is not a positive finite number")
    return values
