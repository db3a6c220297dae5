"""What each synthetic model is: architecture, metadata that exercises its features, and its tensor layout.

Dimensions are shared (n_embd 256 so every K-quant and IQ type fits a row, head_dim 64, 4 layers so that
sliding, no-RoPE and alternating patterns all occur); each ``ArchSpec`` adds the metadata keys and tensor
switches llama.cpp's ``load_arch_hparams`` / ``load_arch_tensors`` read for its architecture.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

N_LAYERS = 4
N_EMBD = 256
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 64
N_FF = 512
N_CTX_TRAIN = 4096
SLIDING_WINDOW = 16  # shorter than the parity sequences, so sliding layers see only part of them


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """One synthetic model.

    Attributes:
        name: the test id (an architecture, or an architecture and the feature it exercises).
        arch: general.architecture.
        metadata: ``{arch}.``-relative keys beyond the common ones (``"rope.scaling.type": "yarn"``).
        qk_norm: "head" (per-head q/k norms), "whole" (olmo2: over the whole projection) or None.
        pre_norms / post_norms: attn_norm + ffn_norm before the blocks; post_attention_norm + post_ffw_norm after.
        fused_qkv / fused_up: phi3's attn_qkv (q, k, v rows) and ffn_up holding gate then up.
        tied: no output.weight (the output is token_embd).
        rope_freqs: a Llama-3 rope_freqs tensor; longrope: rope_factors_long / rope_factors_short tensors.
        embed_std: standard deviation of the embedding (gemma multiplies it by sqrt(n_embd)).
        n_expert / n_expert_used: a mixture-of-experts FFN (router + 3-D expert tensors) in every layer; 0 = dense.
        qkv_bias: attn_q/k/v biases. moe_biases: gpt-oss's router and expert biases. shared_expert: a shared
            expert with its sigmoid gate (qwen2moe). attn_sinks / attn_out_bias: gpt-oss's attention extras.
        ffn_norm_name: the tensor of the norm before the FFN (gpt-oss stores it as post_attention_norm).
        file_types: the llama.cpp file types the parity harness runs for it (None: every dense type).
    """

    name: str
    arch: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    qk_norm: str | None = None
    pre_norms: bool = True
    post_norms: bool = False
    fused_qkv: bool = False
    fused_up: bool = False
    tied: bool = False
    rope_freqs: bool = False
    longrope: bool = False
    embed_std: float = 1.0
    rope_dim: int = HEAD_DIM
    n_expert: int = 0
    n_expert_used: int = 0
    qkv_bias: bool = False
    moe_biases: bool = False
    shared_expert: bool = False
    attn_sinks: bool = False
    attn_out_bias: bool = False
    ffn_norm_name: str = "ffn_norm"
    file_types: tuple[str, ...] | None = None


def llama3_factors(base: float, orig_ctx: int, factor: float = 8.0, low: float = 1.0, high: float = 4.0) -> list[float]:
    """Llama 3.1's rope_freqs rule for head_dim 64. The synthetic model takes a short original context so that
    the divided (long-wavelength) dimensions turn within the parity sequence and the factors matter."""
    factors = []
    for i in range(HEAD_DIM // 2):
        wavelen = 2 * math.pi * base ** (2 * i / HEAD_DIM)
        if wavelen < orig_ctx / high:
            factors.append(1.0)
        elif wavelen > orig_ctx / low:
            factors.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return factors


TIED_EMBED_STD = 0.2  # the output is the embedding: logits' spread about sqrt(n_embd) * 0.2 = 3.2
LONGROPE_ORIG_CTX = 32  # shorter than the parity context (256), so llama.cpp picks the long factors
PHI3_ROPE_DIM = 32  # partial rotary: half of each head


def phi3_attn_factor() -> float:
    """What convert_hf_to_gguf writes for LongRoPE: sqrt(1 + ln(scale) / ln(original context))."""
    scale = N_CTX_TRAIN / LONGROPE_ORIG_CTX
    return math.sqrt(1 + math.log(scale) / math.log(LONGROPE_ORIG_CTX))


N_EXPERT = 8
N_EXPERT_USED = 2
N_FF_EXP = 256  # a multiple of 256: the expert down projection's rows take every K-quant
N_FF_SHEXP = 256
MOE_FILE_TYPES = ("F32", "Q8_0", "Q4_K_M", "MXFP4_MOE")  # the types for gpt-oss (MXFP4 experts)

SPECS = {spec.name: spec for spec in [
    ArchSpec("llama", "llama", rope_freqs=False),
    ArchSpec("llama3-rope-freqs", "llama", rope_freqs=True),
    ArchSpec("llama-yarn", "llama", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                     "rope.scaling.original_context_length": 32}),
    ArchSpec("llama-linear", "llama", {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}),
    ArchSpec("qwen3", "qwen3", {"rope.freq_base": 1000000.0}, qk_norm="head", tied=True, embed_std=TIED_EMBED_STD),
    ArchSpec("qwen3moe", "qwen3moe", {"rope.freq_base": 1000000.0, "expert_count": N_EXPERT,
                                      "expert_used_count": N_EXPERT_USED, "expert_feed_forward_length": N_FF_EXP},
             qk_norm="head", n_expert=N_EXPERT, n_expert_used=N_EXPERT_USED),
    ArchSpec("qwen2moe", "qwen2moe", {"rope.freq_base": 1000000.0, "expert_count": N_EXPERT,
                                      "expert_used_count": N_EXPERT_USED, "expert_feed_forward_length": N_FF_EXP,
                                      "expert_shared_feed_forward_length": N_FF_SHEXP},
             qkv_bias=True, n_expert=N_EXPERT, n_expert_used=N_EXPERT_USED, shared_expert=True,
             file_types=MOE_FILE_TYPES),
    ArchSpec("gpt-oss", "gpt-oss", {"rope.freq_base": 150000.0, "expert_count": N_EXPERT,
                                    "expert_used_count": N_EXPERT_USED, "expert_feed_forward_length": N_FF_EXP,
                                    "attention.sliding_window": SLIDING_WINDOW, "rope.scaling.type": "yarn",
                                    "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32},
             qkv_bias=True, n_expert=N_EXPERT, n_expert_used=N_EXPERT_USED, moe_biases=True, attn_sinks=True,
             attn_out_bias=True, ffn_norm_name="post_attention_norm", file_types=MOE_FILE_TYPES),
    ArchSpec("gemma2", "gemma2", {"attention.sliding_window": SLIDING_WINDOW, "attn_logit_softcapping": 5.0,
                                  "final_logit_softcapping": 8.0}, post_norms=True, tied=True,
             embed_std=3.0 / math.sqrt(N_EMBD)),
    ArchSpec("gemma3-linear", "gemma3", {"attention.sliding_window": SLIDING_WINDOW, "rope.freq_base": 1000000.0,
                                         "rope.scaling.type": "linear", "rope.scaling.factor": 8.0},
             qk_norm="head", post_norms=True, tied=True, embed_std=3.0 / math.sqrt(N_EMBD)),
    ArchSpec("phi3", "phi3", {"attention.sliding_window": SLIDING_WINDOW,
                              "rope.scaling.original_context_length": LONGROPE_ORIG_CTX,
                              "rope.scaling.attn_factor": phi3_attn_factor()},
             fused_qkv=True, fused_up=True, longrope=True, rope_dim=PHI3_ROPE_DIM),
    ArchSpec("mistral3", "mistral3", {"rope.freq_base": 1000000.0, "rope.scaling.type": "yarn",
                                      "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
                                      "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
                                      "rope.scaling.yarn_log_multiplier": 0.2,
                                      "attention.temperature_scale": 0.5}),
    ArchSpec("smollm3", "smollm3", tied=True, embed_std=TIED_EMBED_STD),
    ArchSpec("granite", "granite", {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.03,
                                    "logit_scale": 0.5}),
    ArchSpec("olmo2", "olmo2", qk_norm="whole", pre_norms=False, post_norms=True),
]}
