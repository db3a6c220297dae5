"""The benchmark peer: mlx-lm's own model code for the same architecture, holding this backend's weight arrays.

The peer gets the very same quantized arrays (no copy), mapped to mlx-lm's parameter names, so a benchmark
compares the decoders, not the weights; only the biases of symmetric types (Q4_0, Q5_0, Q8_0, ...), which this
backend makes at each product instead of keeping them (weights.SymmetricMatrix), are made for it, once; matrices
in layouts mlx-lm has no layer for (Q6_K, Q3_K and Q2_K as pairs of terms, MXFP4, NVFP4) reach it as float16. mlx-lm
computes in the dtype its embedding lookup returns (float16, the scales' dtype), which is what this backend's
products use on the GPU; on the CPU, where this backend computes in float32, the peer's embedding lookup is cast
to float32 too (float16 is an order of magnitude slower on MLX's CPU device, which would flatter us). Needs the
optional ``mlx-lm`` package.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..backends.mlx.weights import GROUP, DenseMatrix, Matrix, MxfpMatrix, PairMatrix
from ..config import ModelConfig

# our LayerWeights field -> mlx-lm module path inside a decoder layer
PROJECTIONS = {
    "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
    "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj",
}
NORMS = {
    "llama": {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"},
    "gemma3": {"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffn_norm": "post_feedforward_layernorm",
               "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"},
}
NORMS["qwen2"] = NORMS["llama"]


def model_args(config: ModelConfig) -> tuple[type[nn.Module], object]:
    """mlx-lm's Model class for the architecture and its ModelArgs, from our config."""
    c = config
    common = dict(hidden_size=c.n_embd, num_hidden_layers=c.n_layers, intermediate_size=c.n_ff,
                  num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.rms_eps,
                  vocab_size=c.n_vocab, rope_theta=c.rope_base, max_position_embeddings=c.n_ctx_train)
    if c.arch == "llama":
        from mlx_lm.models import llama
        return llama.Model, llama.ModelArgs(model_type="llama", head_dim=c.head_dim, rope_traditional=True,
                                            tie_word_embeddings=c.tied_embeddings, **common)
    if c.arch == "qwen2":
        from mlx_lm.models import qwen2
        return qwen2.Model, qwen2.ModelArgs(model_type="qwen2", tie_word_embeddings=c.tied_embeddings, **common)
    from mlx_lm.models import gemma3_text
    return gemma3_text.Model, gemma3_text.ModelArgs(
        model_type="gemma3_text", head_dim=c.head_dim, rope_local_base_freq=c.rope_base_local,
        query_pre_attn_scalar=1.0 / c.attn_scale ** 2, sliding_window=c.sliding_window,
        sliding_window_pattern=c.swa_pattern, **common)


def _matrix_params(prefix: str, m: Matrix) -> list[tuple[str, mx.array]]:
    if isinstance(m, DenseMatrix):
        return [(f"{prefix}.weight", m.weight)]
    if isinstance(m, (PairMatrix, MxfpMatrix)):  # layouts mlx-lm's layers cannot hold: float16 rows instead
        return [(f"{prefix}.weight", m.rows(mx.arange(m.n_rows)).astype(mx.float16))]
    return [(f"{prefix}.weight", m.packed), (f"{prefix}.scales", m.scales), (f"{prefix}.biases", m.biases)]


def peer_weights(backend) -> dict[str, mx.array]:
    """Our arrays under mlx-lm's names (Gemma's norms store ``1 + w`` in GGUF and ``w`` in mlx-lm)."""
    c = backend.config
    norm_offset = 1.0 if c.arch == "gemma3" else 0.0
    out: list[tuple[str, mx.array]] = []
    for i, layer in enumerate(backend.layers):
        p = f"model.layers.{i}"
        for field, path in PROJECTIONS.items():
            out += _matrix_params(f"{p}.{path}", getattr(layer, field))
        for field, path in NORMS[c.arch].items():
            out.append((f"{p}.{path}.weight", getattr(layer, field) - norm_offset))
        for field, path in (("bq", "q_proj"), ("bk", "k_proj"), ("bv", "v_proj")):
            if getattr(layer, field) is not None:
                out.append((f"{p}.self_attn.{path}.bias", getattr(layer, field)))
    out.append(("model.norm.weight", backend.output_norm - norm_offset))
    out += _matrix_params("model.embed_tokens", backend.token_embd)
    if backend.output is not backend.token_embd:
        out += _matrix_params("lm_head", backend.output)
    return dict(out)


def build_peer(backend) -> nn.Module:
    """mlx-lm's model for ``backend.config`` holding ``backend``'s weights."""
    model_class, args = model_args(backend.config)
    model = model_class(args)
    weights = model.sanitize(peer_weights(backend))  # drops Gemma's lm_head when the embedding is tied
    bits = {name.rsplit(".", 1)[0]: _bits(backend, name) for name in weights if name.endswith(".scales")}
    nn.quantize(model, class_predicate=lambda path, _: path in bits and {"group_size": GROUP, "bits": bits[path]})
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())  # biases made for the peer are held from here on, not at its first step
    if backend.dtype == mx.float32:
        model.model.embed_tokens = _Float32Embedding(model.model.embed_tokens)
    model.eval()
    return model


class _Float32Embedding(nn.Module):
    """Wraps an embedding so lookups come out float32; ``as_linear`` (the tied output) is unchanged."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def __call__(self, ids: mx.array) -> mx.array:
        return self.inner(ids).astype(mx.float32)

    def as_linear(self, x: mx.array) -> mx.array:
        return self.inner.as_linear(x)


def _bits(backend, scales_name: str) -> int:
    """The bit width of the quantized matrix whose scales are called ``scales_name``."""
    prefix = scales_name.rsplit(".", 1)[0]
    if prefix == "model.embed_tokens":
        return backend.token_embd.bits
    if prefix == "lm_head":
        return backend.output.bits
    layer = backend.layers[int(prefix.split(".")[2])]
    field = next(f for f, path in PROJECTIONS.items() if prefix.endswith(path))
    return getattr(layer, field).bits
