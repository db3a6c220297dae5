"""Where each decoder weight lives in a GGUF file, per layer, for every supported architecture."""

from __future__ import annotations

from .config import ModelConfig
from .gguf_file import GGUFFile, ModelFormatError

# field -> (tensor suffix, required)
LAYER_TENSORS = {
    "attn_norm": ("attn_norm.weight", True),
    "wq": ("attn_q.weight", True),
    "wk": ("attn_k.weight", True),
    "wv": ("attn_v.weight", True),
    "wo": ("attn_output.weight", True),
    "bq": ("attn_q.bias", False),
    "bk": ("attn_k.bias", False),
    "bv": ("attn_v.bias", False),
    "q_norm": ("attn_q_norm.weight", False),
    "k_norm": ("attn_k_norm.weight", False),
    "post_attn_norm": ("post_attention_norm.weight", False),
    "ffn_norm": ("ffn_norm.weight", True),
    "w_gate": ("ffn_gate.weight", True),
    "w_up": ("ffn_up.weight", True),
    "w_down": ("ffn_down.weight", True),
    "post_ffn_norm": ("post_ffw_norm.weight", False),
}


def layer_tensor_names(gguf: GGUFFile, config: ModelConfig, layer: int) -> dict[str, str | None]:
    """Tensor names of one layer by field; optional tensors the model lacks map to None.

    Raises ModelFormatError when a tensor the architecture needs is missing or has the wrong shape.
    """
    names: dict[str, str | None] = {}
    for field, (suffix, required) in LAYER_TENSORS.items():
        name = f"blk.{layer}.{suffix}"
        needed = required or (field in ("bq", "bk", "bv") and config.qkv_bias) \
            or (field in ("q_norm", "k_norm") and config.qk_norm) \
            or (field in ("post_attn_norm", "post_ffn_norm") and config.post_norms)
        if name not in gguf.tensors:
            if needed:
                raise ModelFormatError(f"the model has no tensor {name!r}, which {config.arch} needs")
            name = None
        names[field] = name
    _check_shapes(gguf, config, names)
    return names


def _check_shapes(gguf: GGUFFile, config: ModelConfig, names: dict[str, str | None]) -> None:
    c = config
    expected = {  # GGML order: (row length, rows)
        "wq": (c.n_embd, c.n_q_embd), "wk": (c.n_embd, c.n_kv_embd), "wv": (c.n_embd, c.n_kv_heads * c.v_head_dim),
        "wo": (c.n_heads * c.v_head_dim, c.n_embd), "w_gate": (c.n_embd, c.n_ff), "w_up": (c.n_embd, c.n_ff),
        "w_down": (c.n_ff, c.n_embd), "attn_norm": (c.n_embd,), "ffn_norm": (c.n_embd,),
        "q_norm": (c.head_dim,), "k_norm": (c.head_dim,), "bq": (c.n_q_embd,), "bk": (c.n_kv_embd,),
        "bv": (c.n_kv_heads * c.v_head_dim,), "post_attn_norm": (c.n_embd,), "post_ffn_norm": (c.n_embd,),
    }
    for field, shape in expected.items():
        name = names.get(field)
        if name is not None and gguf.tensors[name].shape != shape:
            raise ModelFormatError(f"tensor {name!r} has shape {gguf.tensors[name].shape}, expected {shape}")


def output_tensor_name(gguf: GGUFFile, config: ModelConfig) -> str:
    """The output projection: ``output.weight``, or the token embedding when the two are tied."""
    name = "token_embd.weight" if config.tied_embeddings else "output.weight"
    shape = gguf.tensor(name).shape
    if shape != (config.n_embd, config.n_vocab):
        raise ModelFormatError(f"tensor {name!r} has shape {shape}, expected ({config.n_embd}, {config.n_vocab})")
    if gguf.tensor("output_norm.weight").shape != (config.n_embd,):
        raise ModelFormatError("tensor 'output_norm.weight' has the wrong shape")
    return name
