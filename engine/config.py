"""ModelConfig: the decoder's hyper-parameters and architecture switches, read from GGUF metadata.

Architecture differences (q/k/v bias, per-head or whole-projection q/k norms, pre- and post-norms,
sliding-window layers, activation, embedding / residual / logit scales, soft-capping, temperature tuning,
layers without RoPE, RoPE layout and scaling) are fields here, so every backend implements one decoder that
reads them. Each architecture's fields come from the metadata keys llama.cpp reads for it, with llama.cpp's
defaults (src/llama-model.cpp, src/models/<arch>.cpp). RoPE scaling is turned into tables by ``engine.rope``.
"""

from __future__ import annotations

import dataclasses
import math

from .gguf_file import GGUFFile, ModelFormatError
from .packed_strings import PackedStrings

# how router logits become weights: llama.cpp's expert_gating_func 1 (softmax), 2 (sigmoid) and 3 (softmax_weight:
# the top-k are chosen on the raw logits and only the chosen logits go through a softmax, gpt-oss)
EXPERT_GATING = ("softmax", "sigmoid", "softmax_weight")
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # rope.scaling.type values llama.cpp knows (alpha: no)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gpt-oss", "gemma2", "gemma3", "phi3",
                           "mistral3", "smollm3", "granite", "olmo2", "qwen35", "qwen35moe", "gemma4")
HYBRID_ARCHS = ("qwen35", "qwen35moe")  # Gated DeltaNet layers between gated full-attention layers
MAX_LAYERS = 1024
MAX_HEADS = 4096
# llama.cpp's LLAMA_ROPE_TYPE_NEOX; qwen35's IMROPE rotates as NEOX when every section has the token's position (text)
NEOX_ROPE_ARCHS = ("qwen2", "qwen2moe", "qwen3", "qwen3moe", "gpt-oss", "gemma2", "gemma3", "gemma4", "phi3", "olmo2",
                   "qwen35", "qwen35moe")
# where llama.cpp's graph asserts rope.dimension_count == head_dim (only phi3 and gemma rotate part of a head)
FULL_ROTARY_ARCHS = ("llama", "qwen2moe", "qwen3", "qwen3moe", "gpt-oss", "mistral3", "smollm3", "granite", "olmo2")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # per-head width of queries and keys
    v_head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool  # True: rotate halves (x[i], x[i+d/2]); False: adjacent pairs (x[2i], x[2i+1])
    rope_scale: float = 1.0  # rope.scaling.factor: positions divided by it (linear), or YaRN's factor
    rope_base_local: float | None = None  # RoPE base of sliding-window layers where it differs
    qkv_bias: bool = False
    qk_norm: bool = False  # per-head q/k RMS norms (head_dim,) before RoPE (gemma3, qwen3)
    post_norms: bool = False  # norm on the attention and FFN outputs before the residual add
    activation: str = "silu"  # gated FFN: "silu" or "gelu_tanh" of the gate times up, or "swiglu_oai" (gpt-oss)
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # multiplier of q·k; filled in __post_init__ when 0
    sliding_window: int = 0  # 0: no sliding-window layers
    swa_pattern: int = 0  # layers with il % swa_pattern < swa_pattern - 1 use the sliding window
    tied_embeddings: bool = True
    has_rope_freqs: bool = False  # a rope_freqs tensor divides the frequencies (Llama 3.1 scaling)
    # -- architecture blocks every backend's decoder implements ------------------------------------------
    pre_norms: bool = True  # False (olmo2): no attn_norm / ffn_norm before the blocks
    qk_norm_whole: bool = False  # olmo2: q_norm (n_q_embd,) / k_norm (n_kv_embd,) over the whole projection
    attn_softcap: float = 0.0  # gemma2: scores (after the q·k scale) -> c * tanh(scores / c); 0 = off
    final_softcap: float = 0.0  # gemma2: logits -> c * tanh(logits / c); 0 = off
    residual_scale: float = 1.0  # granite: attention and FFN outputs multiplied by it before the residual add
    logit_scale: float = 1.0  # granite: logits multiplied by it (the reciprocal of the GGUF's logit_scale)
    rope_mscale: float = 1.0  # cos and sin multiplied by it (YaRN / LongRoPE attention factor, ggml's mscale)
    attn_temp_scale: float = 0.0  # mistral3 temperature tuning: q *= log(floor(pos / floor) + 1) * scale + 1
    attn_temp_floor: int = 0
    no_rope_every: int = 0  # smollm3: layers with (il + 1) % no_rope_every == 0 have no RoPE
    use_rope: bool = True  # granite with rope.scaling.finetuned false: no layer has RoPE
    # -- RoPE scaling inputs of rope.rope_tables (backends use its tables, not these) ---------------------
    rope_scaling: str = "none"  # "none", "linear", "yarn" or "longrope"
    rope_scale_local: float | None = None  # the sliding layers' factor where it differs (None: rope_scale)
    rope_factors: bool = False  # LongRoPE: rope_factors_long / rope_factors_short tensors, chosen by n_ctx
    yarn_orig_ctx: int = 0  # rope.scaling.original_context_length (llama.cpp's n_ctx_orig_yarn)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_log_mul: float = 0.0
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor
    # -- mixture of experts (llama.cpp build_moe_ffn): n_expert 0 = a dense FFN ----------------------------
    n_expert: int = 0  # experts per MoE layer (expert_count)
    n_expert_used: int = 0  # experts each token is routed to (expert_used_count, the top-k)
    n_ff_exp: int = 0  # hidden width of one expert (expert_feed_forward_length)
    expert_gating: str = "softmax"  # router logits -> probabilities: "softmax" or "sigmoid"
    expert_norm_weights: bool = False  # the chosen experts' weights renormalised to sum to 1
    expert_weights_scale: float = 1.0  # the chosen experts' weights multiplied by it
    expert_weights_before: bool = False  # the weight multiplies the expert's input, not its output (llama4)
    expert_selection_bias: bool = False  # exp_probs_b: a per-expert bias added to the probabilities for the choice
    moe_biases: bool = False  # gpt-oss: router bias (ffn_gate_inp.bias) and per-expert gate/up/down biases
    n_ff_shexp: int = 0  # hidden width of the shared expert every token also runs (0: none)
    shexp_gate: bool = False  # the shared expert's output times sigmoid(ffn_gate_inp_shexp . x) (qwen2moe)
    # -- attention blocks -----------------------------------------------------------------------------------
    attn_sinks: bool = False  # gpt-oss: a learned per-head logit (attn_sinks) that joins every softmax
    attn_out_bias: bool = False  # gpt-oss: attn_output.bias
    # -- hybrid models (qwen35): Gated DeltaNet layers (engine.deltanet) among gated attention layers --------
    recurrent_layers: tuple[int, ...] = ()  # the layers that are Gated DeltaNet; () = every layer is attention
    attn_output_gate: bool = False  # attn_q holds per head the query then a gate; output *= sigmoid(gate)
    ssm_d_conv: int = 0  # ssm.conv_kernel: the causal conv's width
    ssm_d_state: int = 0  # ssm.state_size: head_k_dim (= head_v_dim)
    ssm_n_k_heads: int = 0  # ssm.group_count
    ssm_n_v_heads: int = 0  # ssm.time_step_rank
    ssm_value_dim: int = 0  # ssm.inner_size = n_v_heads * head_v_dim
    n_mtp_layers: int = 0  # nextn_predict_layers: multi-token-prediction blocks after the n_layers trunk, not run
    # -- gemma4 (engine.gemma4): layer geometry by kind, shared KV, per-layer embeddings -------------------
    head_dim_swa: int = 0  # head width (q, k and v) of the sliding-window layers; 0: head_dim
    rope_dim_swa: int = 0  # rotated dimensions of the sliding-window layers; 0: rope_dim
    v_norm: bool = False  # values RMS-normed without a weight; a layer without attn_v uses its raw keys
    n_kv_shared_layers: int = 0  # the last n layers attend over the cache of the last earlier layer of their kind
    n_embd_per_layer: int = 0  # width of the per-layer embedding inputs; 0: none
    n_kv_heads_swa: int = 0  # KV heads of the sliding-window layers where they differ (head_count_kv array); 0: same
    n_ff_shared: int = 0  # FFN width of the shared-KV layers where it differs (double-wide MLP); 0: n_ff
    ffn_dense_and_experts: bool = False  # gemma4 26B-A4B: a dense FFN and the experts side by side, own norms

    def __post_init__(self):
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        if self.yarn_orig_ctx == 0:
            object.__setattr__(self, "yarn_orig_ctx", self.n_ctx_train)

    @property
    def n_q_embd(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def n_kv_embd(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_hybrid(self) -> bool:
        return bool(self.recurrent_layers)

    def is_recurrent(self, layer: int) -> bool:
        """Whether ``layer`` is a Gated DeltaNet layer (a recurrent state, no KV cache)."""
        return layer in self.recurrent_layers

    @property
    def ssm_head_v_dim(self) -> int:
        return self.ssm_value_dim // self.ssm_n_v_heads if self.ssm_n_v_heads else 0

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the conv: q and k (n_k_heads * d_state each), then v (value_dim)."""
        return 2 * self.ssm_n_k_heads * self.ssm_d_state + self.ssm_value_dim

    @property
    def local_rope_scale(self) -> float:
        return self.rope_scale if self.rope_scale_local is None else self.rope_scale_local

    def layer_head_dim(self, layer: int) -> int:
        """Head width of ``layer``'s queries, keys and values where it depends on the layer kind (gemma4)."""
        return self.head_dim_swa if self.head_dim_swa and self.is_sliding(layer) else self.head_dim

    def layer_n_kv_heads(self, layer: int) -> int:
        return self.n_kv_heads_swa if self.n_kv_heads_swa and self.is_sliding(layer) else self.n_kv_heads

    def layer_n_ff(self, layer: int) -> int:
        return self.n_ff_shared if self.n_ff_shared and self.kv_layer(layer) != layer else self.n_ff

    def layer_v_head_dim(self, layer: int) -> int:
        return self.head_dim_swa if self.head_dim_swa and self.is_sliding(layer) else self.v_head_dim

    def layer_rope_dim(self, layer: int) -> int:
        return self.rope_dim_swa if self.rope_dim_swa and self.is_sliding(layer) else self.rope_dim

    def kv_layer(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends over: itself, or for gemma4's shared layers the last
        layer of the same kind that has keys and values (llama.cpp's ``layer_reuse_cb``)."""
        n_kv = self.n_layers - self.n_kv_shared_layers
        if layer < n_kv:
            return layer
        return n_kv - (2 if self.is_sliding(layer) else 1)

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends only to the last ``sliding_window`` positions."""
        return self.sliding_window > 0 and self.swa_pattern > 0 and layer % self.swa_pattern < self.swa_pattern - 1

    def is_rope_layer(self, layer: int) -> bool:
        """Whether ``layer`` rotates its queries and keys (llama.cpp smollm3: ``(il + 1) % 4 != 0``)."""
        return self.use_rope and not (self.no_rope_every > 0 and (layer + 1) % self.no_rope_every == 0)

    def layer_rope_base(self, layer: int) -> float:
        if self.rope_base_local is not None and self.is_sliding(layer):
            return self.rope_base_local
        return self.rope_base

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelConfig:
        """Build the config from a GGUF file's metadata and tensor list; unknown keys are ignored.

        Every field is filled from the keys llama.cpp reads for the architecture (src/llama-model.cpp and
        src/models/<arch>.cpp), with llama.cpp's defaults.
        """
        arch = gguf.get("general.architecture", str)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFormatError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        arrays = _layer_arrays(gguf, arch)

        def num(key: str, default=dataclasses.MISSING, kind=int):
            if key in arrays:  # gemma4's per-layer values: the largest here, by layer kind in _gemma4
                return max(arrays[key])
            return gguf.get(f"{arch}.{key}", kind, default)

        n_embd = _positive(num("embedding_length"), "embedding_length", 1 << 20)
        n_heads = _positive(num("attention.head_count"), "attention.head_count", MAX_HEADS)
        n_kv_heads = _positive(num("attention.head_count_kv", n_heads), "attention.head_count_kv", MAX_HEADS)
        if n_heads % n_kv_heads:
            raise ModelFormatError(f"head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")
        head_dim = _positive(num("attention.key_length", n_embd // n_heads), "attention.key_length", 1 << 14)
        embd = gguf.tensor("token_embd.weight")
        n_ctx_train = _positive(num("context_length", 2048), "context_length", 1 << 24)
        fields = dict(
            arch=arch,
            n_layers=_positive(num("block_count"), "block_count", MAX_LAYERS),
            n_embd=n_embd,
            n_ff=_positive(num("feed_forward_length"), "feed_forward_length", 1 << 20),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            v_head_dim=_positive(num("attention.value_length", head_dim), "attention.value_length", 1 << 14),
            n_vocab=embd.shape[1] if len(embd.shape) == 2 else 0,
            n_ctx_train=n_ctx_train,
            rms_eps=num("attention.layer_norm_rms_epsilon", 1e-5, float),
            rope_base=num("rope.freq_base", 10000.0, float),
            rope_dim=_positive(num("rope.dimension_count", head_dim), "rope.dimension_count", head_dim),
            rope_neox=arch in NEOX_ROPE_ARCHS,
            qkv_bias="blk.0.attn_q.bias" in gguf.tensors or "blk.0.attn_qkv.bias" in gguf.tensors,
            tied_embeddings="output.weight" not in gguf.tensors,
            has_rope_freqs="rope_freqs.weight" in gguf.tensors,
            yarn_orig_ctx=_positive(num("rope.scaling.original_context_length", n_ctx_train),
                                    "rope.scaling.original_context_length", 1 << 24),
            rope_attn_factor=num("rope.scaling.attn_factor", 1.0, float),
        )
        if embd.shape[0] != n_embd or fields["n_vocab"] <= 0:
            raise ModelFormatError(f"token_embd.weight has shape {embd.shape}, expected ({n_embd}, n_vocab)")
        tokens = gguf.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, PackedStrings) and len(tokens) > fields["n_vocab"]:  # fewer is fine: padded embeddings
            raise ModelFormatError(f"the tokenizer has {len(tokens)} tokens but token_embd.weight has only "
                                   f"{fields['n_vocab']} rows: token ids from {fields['n_vocab']} on have no embedding")
        if arch in FULL_ROTARY_ARCHS and fields["rope_dim"] != head_dim:
            raise ModelFormatError(f"metadata {arch}.rope.dimension_count = {fields['rope_dim']}, but {arch} "
                                   f"rotates whole heads of {head_dim}")
        fields.update(_rope_scaling_fields(gguf, arch))
        fields.update(_ARCH_FIELDS.get(arch, _no_fields)(gguf, arch, fields))
        config = cls(**fields)
        _check_rope_mscale(config)
        return config


def _layer_arrays(gguf: GGUFFile, arch: str) -> dict[str, list[int]]:
    """gemma4's per-layer head_count_kv / feed_forward_length arrays, by key; other architectures have none."""
    if arch != "gemma4":
        return {}
    from .gemma4 import layer_arrays

    return layer_arrays(gguf, arch)


def _no_fields(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    return {}


def _rope_scaling_fields(gguf: GGUFFile, arch: str) -> dict:
    """rope.scaling.type (llama.cpp's default is "linear") and factor (the old key rope.scale_linear too)."""
    kind = gguf.get(f"{arch}.rope.scaling.type", str, "linear")
    if kind not in ROPE_SCALING_TYPES:
        raise ModelFormatError(f"metadata {arch}.rope.scaling.type = {kind!r} is not supported "
                               f"(supported: {', '.join(ROPE_SCALING_TYPES)})")
    factor = gguf.get(f"{arch}.rope.scaling.factor", float, 0.0) or gguf.get(f"{arch}.rope.scale_linear", float, 0.0)
    if not (factor == 0.0 or 0.0 < factor <= 1e6) or not math.isfinite(factor):
        raise ModelFormatError(f"metadata {arch}.rope.scaling.factor = {factor} is out of range")
    scale = 1.0 if kind == "none" or factor == 0.0 else factor  # llama.cpp: freq_scale 1 for "none"
    fields = dict(rope_scaling=kind, rope_scale=scale)
    if kind == "yarn" and scale < 1.0:
        raise ModelFormatError(f"metadata {arch}.rope.scaling.factor = {factor}: YaRN needs a factor of at least 1")
    if kind == "longrope" or arch == "phi3":  # phi3 loads long/short factors whatever the type says
        fields["rope_factors"] = "rope_factors_long.weight" in gguf.tensors or "rope_factors_short.weight" in gguf.tensors
    return fields


def _gemma_common(gguf: GGUFFile, arch: str, fields: dict, default_window: int, default_pattern: int) -> dict:
    n_embd, n_heads = fields["n_embd"], fields["n_heads"]
    window = gguf.get(f"{arch}.attention.sliding_window", int, default_window)
    big = fields["n_layers"] == (46 if arch == "gemma2" else 62)  # llama.cpp: LLM_TYPE_27B
    return dict(
        post_norms=True,
        activation="gelu_tanh",
        embed_scale=math.sqrt(n_embd),
        rope_base_local=gguf.get(f"{arch}.rope.freq_base_swa", float, 10000.0),
        sliding_window=_non_negative(window, f"{arch}.attention.sliding_window"),
        swa_pattern=_swa_pattern(gguf, arch, fields["n_layers"], default_pattern) if window > 0 else 0,
        # gemma_pytorch: 1/sqrt(n_embd/n_head) for the 27B models, 1/sqrt(head_dim) for the others
        attn_scale=1.0 / math.sqrt(n_embd // n_heads if big else fields["head_dim"]),
        final_softcap=_non_negative_float(gguf.get(f"{arch}.final_logit_softcapping", float,
                                                   30.0 if arch == "gemma2" else 0.0), f"{arch}.final_logit_softcapping"),
    )


def _gemma2(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    out = _gemma_common(gguf, arch, fields, default_window=4096, default_pattern=2)
    out.update(attn_softcap=_non_negative_float(gguf.get(f"{arch}.attn_logit_softcapping", float, 50.0),
                                                f"{arch}.attn_logit_softcapping"),
               rope_base_local=gguf.get(f"{arch}.rope.freq_base_swa", float, fields["rope_base"]))
    return out


def _gemma3(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    out = _gemma_common(gguf, arch, fields, default_window=0, default_pattern=6)
    out.update(qk_norm=True, rope_scale_local=1.0)  # llama.cpp: the sliding layers are never scaled
    return out


def _gemma4(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    from .gemma4 import gemma4_fields  # its own module: the geometry checks are long

    out = _gemma_common(gguf, arch, fields, default_window=0, default_pattern=6)
    out.update(gemma4_fields(gguf, arch, fields, out))
    return out


def _qwen3(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    return dict(qk_norm=True)


def _experts(gguf: GGUFFile, arch: str, fields: dict, ff_required: bool = False) -> dict:
    """expert_count, expert_used_count and expert_feed_forward_length (by default n_ff / n_expert_used, as
    llama.cpp's qwen MoE loaders; required where llama.cpp requires it)."""
    n_expert = _positive(gguf.get(f"{arch}.expert_count", int, 0), f"{arch}.expert_count", 1 << 12)
    used = _positive(gguf.get(f"{arch}.expert_used_count", int, 0), f"{arch}.expert_used_count", n_expert)
    key = f"{arch}.expert_feed_forward_length"
    n_ff_exp = gguf.get(key, int) if ff_required else gguf.get(key, int, 0) or fields["n_ff"] // used
    return dict(n_expert=n_expert, n_expert_used=used, n_ff_exp=_positive(n_ff_exp, key, 1 << 20))


def _qwen3moe(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    """qwen3moe: every layer's FFN is a softmax-routed mixture with renormalised top-k weights."""
    return dict(qk_norm=True, expert_gating="softmax", expert_norm_weights=True, **_experts(gguf, arch, fields))


def _qwen2moe(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    """qwen2moe: softmax routing without renormalisation, plus a shared expert gated by sigmoid(w . x)."""
    n_ff_shexp = gguf.get(f"{arch}.expert_shared_feed_forward_length", int, 0) or fields["n_ff"]
    return dict(expert_gating="softmax", expert_norm_weights=False, shexp_gate=True,
                n_ff_shexp=_positive(n_ff_shexp, f"{arch}.expert_shared_feed_forward_length", 1 << 20),
                **_experts(gguf, arch, fields))


def _gpt_oss(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    """gpt-oss (llama.cpp LLM_ARCH_OPENAI_MOE): attention sinks, every other layer (the even ones) a sliding
    window, an output bias, and a biased mixture routed by a softmax over the chosen logits with the clamped
    SwiGLU (alpha 1.702, limit 7)."""
    window = _positive(gguf.get(f"{arch}.attention.sliding_window", int), f"{arch}.attention.sliding_window",
                       1 << 24)
    return dict(sliding_window=window, swa_pattern=_swa_pattern(gguf, arch, fields["n_layers"], 2),
                rope_base_local=gguf.get(f"{arch}.rope.freq_base_swa", float, fields["rope_base"]),
                attn_sinks=True, attn_out_bias=True, moe_biases=True, activation="swiglu_oai",
                expert_gating="softmax_weight", expert_norm_weights=False,
                **_experts(gguf, arch, fields, ff_required=True))


def _phi3(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    # llama.cpp reads phi3's attention.sliding_window but disables it ("Phi SWA is currently disabled"):
    # every layer attends to the whole context, and so do we, to give the same output.
    return {}


def _mistral3(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    out = dict(
        yarn_beta_fast=gguf.get(f"{arch}.rope.scaling.yarn_beta_fast", float, 32.0),
        yarn_beta_slow=gguf.get(f"{arch}.rope.scaling.yarn_beta_slow", float, 1.0),
        yarn_log_mul=gguf.get(f"{arch}.rope.scaling.yarn_log_multiplier", float, 0.0),
        attn_temp_scale=_non_negative_float(gguf.get(f"{arch}.attention.temperature_scale", float, 0.0),
                                            f"{arch}.attention.temperature_scale"),
    )
    if out["attn_temp_scale"] != 0.0:
        out["attn_temp_floor"] = fields["yarn_orig_ctx"]  # llama.cpp: n_attn_temp_floor_scale = n_ctx_orig_yarn
    return out


def _smollm3(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    return dict(no_rope_every=4)  # llama.cpp: n_no_rope_layer_step = 4


def _granite(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    logit_scale = gguf.get(f"{arch}.logit_scale", float)  # required by llama.cpp
    residual = gguf.get(f"{arch}.residual_scale", float, 0.0)
    embedding = gguf.get(f"{arch}.embedding_scale", float, 0.0)
    attention = gguf.get(f"{arch}.attention.scale", float, 0.0)
    for key, value in (("logit_scale", logit_scale), ("residual_scale", residual),
                       ("embedding_scale", embedding), ("attention.scale", attention)):
        if not math.isfinite(value) or value < 0 or (key == "logit_scale" and value == 0):
            raise ModelFormatError(f"metadata {arch}.{key} = {value} is out of range")
    return dict(
        logit_scale=1.0 / logit_scale,
        residual_scale=residual or 1.0,  # llama.cpp: 0 means no scaling
        embed_scale=embedding or 1.0,
        attn_scale=attention,  # 0: 1/sqrt(head_dim), filled in __post_init__
        use_rope=gguf.get(f"{arch}.rope.scaling.finetuned", bool, True),
    )


def _olmo2(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    out = dict(pre_norms=False, post_norms=True, qk_norm_whole=True)
    window = gguf.get(f"{arch}.attention.sliding_window", int, 0)
    if window > 0:
        out.update(sliding_window=window, swa_pattern=_swa_pattern(gguf, arch, fields["n_layers"], 4),
                   rope_base_local=gguf.get(f"{arch}.rope.freq_base_swa", float, fields["rope_base"]),
                   rope_scale_local=1.0)
        if fields["rope_scaling"] == "yarn":  # llama.cpp turns YaRN off on the sliding layers only
            raise ModelFormatError("olmo2 with sliding-window layers and YaRN scaling is not supported")
    return out


def _qwen35(gguf: GGUFFile, arch: str, fields: dict) -> dict:
    """qwen35 / qwen35moe (llama.cpp src/models/qwen35*.cpp): recurrent layers from attention.recurrent_layers,
    else every layer but each full_attention_interval-th; gated attention with per-head q/k norms."""
    n_mtp = gguf.get(f"{arch}.nextn_predict_layers", int, 0)  # block_count counts them; llama.cpp skips them
    if not 0 <= n_mtp < fields["n_layers"]:
        raise ModelFormatError(f"metadata {arch}.nextn_predict_layers = {n_mtp} is out of range "
                               f"(0 to block_count - 1)")
    n_layers = fields["n_layers"] - n_mtp
    flags = gguf.metadata.get(f"{arch}.attention.recurrent_layers")
    if flags is not None:
        if not hasattr(flags, "__len__") or len(flags) < n_layers:
            raise ModelFormatError(f"metadata {arch}.attention.recurrent_layers must flag each of the {n_layers} layers")
        recurrent = tuple(il for il in range(n_layers) if flags[il])
    else:
        interval = _positive(gguf.get(f"{arch}.full_attention_interval", int, 4), f"{arch}.full_attention_interval",
                             MAX_LAYERS)
        recurrent = tuple(il for il in range(n_layers) if (il + 1) % interval != 0)
    out = dict(qk_norm=True, attn_output_gate=True, recurrent_layers=recurrent, n_layers=n_layers, n_mtp_layers=n_mtp,
               ssm_d_conv=_positive(gguf.get(f"{arch}.ssm.conv_kernel", int), f"{arch}.ssm.conv_kernel", 64),
               ssm_d_state=_positive(gguf.get(f"{arch}.ssm.state_size", int), f"{arch}.ssm.state_size", 1 << 12),
               ssm_n_k_heads=_positive(gguf.get(f"{arch}.ssm.group_count", int), f"{arch}.ssm.group_count", MAX_HEADS),
               ssm_n_v_heads=_positive(gguf.get(f"{arch}.ssm.time_step_rank", int), f"{arch}.ssm.time_step_rank",
                                       MAX_HEADS),
               ssm_value_dim=_positive(gguf.get(f"{arch}.ssm.inner_size", int), f"{arch}.ssm.inner_size", 1 << 20))
    if out["ssm_n_v_heads"] % out["ssm_n_k_heads"]:
        raise ModelFormatError(f"metadata {arch}.ssm.time_step_rank {out['ssm_n_v_heads']} is not a multiple of "
                               f"ssm.group_count {out['ssm_n_k_heads']}")
    if out["ssm_value_dim"] != out["ssm_n_v_heads"] * out["ssm_d_state"]:
        raise ModelFormatError(f"metadata {arch}.ssm.inner_size {out['ssm_value_dim']} is not ssm.time_step_rank x "
                               f"ssm.state_size (head_k_dim and head_v_dim must be equal)")
    if fields["head_dim"] != fields["v_head_dim"]:
        raise ModelFormatError(f"{arch} needs attention.key_length == attention.value_length")
    if arch == "qwen35moe":
        moe = _qwen3moe(gguf, arch, fields)
        moe.update(n_ff_shexp=gguf.get(f"{arch}.expert_shared_feed_forward_length", int, 0) or fields["n_ff"],
                   shexp_gate=True)  # the shared expert scaled by sigmoid(ffn_gate_inp_shexp . x), as qwen2moe's
        out.update(moe)
    return out


_ARCH_FIELDS = {"gemma2": _gemma2, "gemma3": _gemma3, "qwen3": _qwen3, "qwen3moe": _qwen3moe, "qwen2moe": _qwen2moe,
                "gpt-oss": _gpt_oss, "phi3": _phi3, "mistral3": _mistral3, "qwen35": _qwen35, "qwen35moe": _qwen35,
                "gemma4": _gemma4, "smollm3": _smollm3, "granite": _granite, "olmo2": _olmo2}


def _swa_pattern(gguf: GGUFFile, arch: str, n_layers: int, default: int) -> int:
    """attention.sliding_window_pattern: an int n (layers il % n < n - 1 slide), or a per-layer bool array
    that must follow such a pattern (llama.cpp's set_swa_pattern, dense last)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = gguf.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        flags = [bool(v) for v in value] if hasattr(value, "__len__") else None
        for n in range(1, n_layers + 2):
            if flags == [il % n < n - 1 for il in range(n_layers)]:
                return n
        raise ModelFormatError(f"metadata {key} is not a pattern of sliding layers this engine supports")
    return _positive(value, key, MAX_LAYERS + 1)


def _check_rope_mscale(config: ModelConfig) -> None:
    """Fill ``rope_mscale``; one factor must serve every RoPE set (YaRN on layers of different scales is not)."""
    from .rope import yarn_mscale

    mscale = yarn_mscale(config)
    if any(config.is_sliding(il) for il in range(config.n_layers)) and yarn_mscale(config, config.local_rope_scale) != mscale:
        raise ModelFormatError(f"{config.arch} with YaRN and differently scaled sliding-window layers is not supported")
    object.__setattr__(config, "rope_mscale", mscale)


def _non_negative_float(value: float, key: str) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ModelFormatError(f"metadata {key} = {value} is out of range")
    return value


def _non_negative(value: int, key: str) -> int:
    if not 0 <= value <= 1 << 24:
        raise ModelFormatError(f"metadata {key} = {value} is out of range")
    return value


def _positive(value: int, key: str, limit: int) -> int:
    if not 0 < value <= limit:
        raise ModelFormatError(f"metadata {key} = {value} is out of range (1 to {limit})")
    return value
