"""GGUF headers of model files, per architecture, without tensor data: for verdicts judged from a header alone.

``model_header`` gives the metadata and tensor table of a small model of one architecture, with llama.cpp's
tensor names and GGML shapes (``src/llama-arch.cpp``'s tables, ``src/models/*.cpp``); ``header_bytes``
serializes it with ``gguf.GGUFWriter`` and returns the header and the size the whole file would have;
``write_model_file`` writes that file with all-zero tensor data (sparse on disk), which every GGML type
accepts, so a backend can load it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from tests.engine.gguf_builders import TINY_VOCAB_SIZE, _infer_type, _tiny_metadata

Q = GGMLQuantizationType
ALIGNMENT = 32

# layer tensor suffix -> GGML shape as a function of (E embedding, H heads, K kv heads, D head dim, F ffn)
_ATTN = {"attn_q.weight": lambda E, H, K, D, F: (E, H * D), "attn_k.weight": lambda E, H, K, D, F: (E, K * D),
         "attn_v.weight": lambda E, H, K, D, F: (E, K * D), "attn_output.weight": lambda E, H, K, D, F: (H * D, E)}
_FFN = {"ffn_gate.weight": lambda E, H, K, D, F: (E, F), "ffn_up.weight": lambda E, H, K, D, F: (E, F),
        "ffn_down.weight": lambda E, H, K, D, F: (F, E)}
_PRE_NORMS = {"attn_norm.weight": lambda E, H, K, D, F: (E,), "ffn_norm.weight": lambda E, H, K, D, F: (E,)}
_POST_NORMS = {"post_attention_norm.weight": lambda E, H, K, D, F: (E,),
               "post_ffw_norm.weight": lambda E, H, K, D, F: (E,)}
_QK_NORM = {"attn_q_norm.weight": lambda E, H, K, D, F: (D,), "attn_k_norm.weight": lambda E, H, K, D, F: (D,)}
_QKV_BIAS = {"attn_q.bias": lambda E, H, K, D, F: (H * D,), "attn_k.bias": lambda E, H, K, D, F: (K * D,),
             "attn_v.bias": lambda E, H, K, D, F: (K * D,)}
_LLAMA = {**_PRE_NORMS, **_ATTN, **_FFN}
_HYBRID_NORMS = {"attn_norm.weight": lambda E, H, K, D, F: (E,), "post_attention_norm.weight": lambda E, H, K, D, F: (E,)}
_SHARED_EXPERT = {"ffn_gate_inp_shexp.weight": lambda E, H, K, D, F: (E,),
                  "ffn_gate_shexp.weight": lambda E, H, K, D, F: (E, F), "ffn_up_shexp.weight": lambda E, H, K, D, F: (E, F),
                  "ffn_down_shexp.weight": lambda E, H, K, D, F: (F, E)}
_N_EXPERT = 4  # with 2 used, each of F / 2 hidden rows (a multiple of 256 for F = 512)
_EXPERTS = {"ffn_gate_inp.weight": lambda E, H, K, D, F: (E, _N_EXPERT),
            "ffn_gate_exps.weight": lambda E, H, K, D, F: (E, F // 2, _N_EXPERT),
            "ffn_up_exps.weight": lambda E, H, K, D, F: (E, F // 2, _N_EXPERT),
            "ffn_down_exps.weight": lambda E, H, K, D, F: (F // 2, E, _N_EXPERT)}
_EXPERT_BIASES = {"ffn_gate_inp.bias": lambda E, H, K, D, F: (_N_EXPERT,),
                  "ffn_gate_exps.bias": lambda E, H, K, D, F: (F // 2, _N_EXPERT),
                  "ffn_up_exps.bias": lambda E, H, K, D, F: (F // 2, _N_EXPERT),
                  "ffn_down_exps.bias": lambda E, H, K, D, F: (E, _N_EXPERT)}
_SHARED_EXPERT = {"ffn_gate_inp_shexp.weight": lambda E, H, K, D, F: (E,),
                  "ffn_gate_shexp.weight": lambda E, H, K, D, F: (E, F), "ffn_up_shexp.weight": lambda E, H, K, D, F: (E, F),
                  "ffn_down_shexp.weight": lambda E, H, K, D, F: (F, E)}

LAYER_TENSORS: dict[str, dict] = {
    "llama": _LLAMA,
    "mistral3": _LLAMA,
    "smollm3": _LLAMA,
    "granite": _LLAMA,
    "qwen2": {**_LLAMA, **_QKV_BIAS},
    "qwen3": {**_LLAMA, **_QK_NORM},
    "qwen3moe": {**_PRE_NORMS, **_ATTN, **_QK_NORM, **_EXPERTS},
    "qwen2moe": {**_PRE_NORMS, **_ATTN, **_QKV_BIAS, **_EXPERTS, **_SHARED_EXPERT},
    # gpt-oss: its norm before the FFN is stored as post_attention_norm; sinks, an output bias, expert biases
    "gpt-oss": {"attn_norm.weight": lambda E, H, K, D, F: (E,), "post_attention_norm.weight": lambda E, H, K, D, F: (E,),
                **_ATTN, **_QKV_BIAS, "attn_sinks.weight": lambda E, H, K, D, F: (H,),
                "attn_output.bias": lambda E, H, K, D, F: (E,), **_EXPERTS, **_EXPERT_BIASES},
    "gemma2": {**_LLAMA, **_POST_NORMS},
    "gemma3": {**_LLAMA, **_POST_NORMS, **_QK_NORM},
    "gemma4": {**_LLAMA, **_POST_NORMS, **_QK_NORM},  # without per-layer embeddings or shared KV layers
    # OLMo 2 normalises after attention and FFN only, and its q/k norms span all heads
    "olmo2": {**_ATTN, **_FFN, **_POST_NORMS, "attn_q_norm.weight": lambda E, H, K, D, F: (H * D,),
              "attn_k_norm.weight": lambda E, H, K, D, F: (K * D,)},
    # Phi-3: fused q/k/v and fused gate/up
    "phi3": {**_PRE_NORMS, "attn_qkv.weight": lambda E, H, K, D, F: (E, (H + 2 * K) * D),
             "attn_output.weight": lambda E, H, K, D, F: (H * D, E), "ffn_up.weight": lambda E, H, K, D, F: (E, 2 * F),
             "ffn_down.weight": lambda E, H, K, D, F: (F, E)},
    # qwen35: gated attention (attn_q holds query and gate) every 2nd layer (full_attention_interval 2 below),
    # Gated DeltaNet layers (RECURRENT_LAYER_TENSORS) in between; the FFN's pre-norm is post_attention_norm
    "qwen35": {**_ATTN, **_QK_NORM, **_FFN, **_HYBRID_NORMS, "attn_q.weight": lambda E, H, K, D, F: (E, 2 * H * D)},
    "qwen35moe": {**_ATTN, **_QK_NORM, **_EXPERTS, **_SHARED_EXPERT, **_HYBRID_NORMS,
                  "attn_q.weight": lambda E, H, K, D, F: (E, 2 * H * D)},
}
# recurrent layers of hybrid models (the ssm.* metadata below): d_state 64, 2 key heads, 4 value heads, kernel 4
_DELTANET = {"attn_qkv.weight": lambda E, H, K, D, F: (E, 512), "attn_gate.weight": lambda E, H, K, D, F: (E, 256),
             "ssm_conv1d.weight": lambda E, H, K, D, F: (4, 512), "ssm_dt.bias": lambda E, H, K, D, F: (4,),
             "ssm_a": lambda E, H, K, D, F: (4,), "ssm_beta.weight": lambda E, H, K, D, F: (E, 4),
             "ssm_alpha.weight": lambda E, H, K, D, F: (E, 4), "ssm_norm.weight": lambda E, H, K, D, F: (64,),
             "ssm_out.weight": lambda E, H, K, D, F: (256, E)}
RECURRENT_LAYER_TENSORS = {
    "qwen35": {**_HYBRID_NORMS, **_DELTANET, **_FFN},
    "qwen35moe": {**_HYBRID_NORMS, **_DELTANET, **_EXPERTS, **_SHARED_EXPERT},
}
ALWAYS_F32 = ("ssm_conv1d.weight",)  # llama.cpp never quantizes these (rows of the conv kernel's width)
TIED = {"gemma2", "gemma3"}  # files of these have no output.weight
TIED = {"gemma2", "gemma3", "gemma4"}  # files of these have no output.weight
EXTRA_METADATA: dict[str, dict[str, Any]] = {
    "gemma2": {"attention.sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3": {"attention.sliding_window": 512},
    "gemma4": {"attention.sliding_window": 512, "embedding_length_per_layer_input": 0},
    "qwen3moe": {"expert_count": _N_EXPERT, "expert_used_count": 2},  # expert_feed_forward_length: n_ff / used
    "qwen2moe": {"expert_count": _N_EXPERT, "expert_used_count": 2},  # shared expert: n_ff wide
    "gpt-oss": {"expert_count": _N_EXPERT, "expert_used_count": 2, "attention.sliding_window": 128,
                "expert_feed_forward_length": lambda n_ff: n_ff // 2},  # required by gpt-oss; F // 2 as the tensors
    "qwen35": {"full_attention_interval": 2, "ssm.conv_kernel": 4, "ssm.state_size": 64, "ssm.group_count": 2,
               "ssm.time_step_rank": 4, "ssm.inner_size": 256},
    "qwen35moe": {"full_attention_interval": 2, "ssm.conv_kernel": 4, "ssm.state_size": 64, "ssm.group_count": 2,
                  "ssm.time_step_rank": 4, "ssm.inner_size": 256, "expert_count": _N_EXPERT, "expert_used_count": 2},
    "granite": {"attention.scale": 0.0078125, "embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 8.0},
}


@dataclasses.dataclass
class ModelHeader:
    """A model file's metadata and tensor table: (name, GGML shape, type) in file order."""

    metadata: dict[str, Any]
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]]

    def drop(self, name: str) -> ModelHeader:
        return ModelHeader(self.metadata, [t for t in self.tensors if t[0] != name])

    def reshape(self, name: str, shape: tuple[int, ...]) -> ModelHeader:
        return ModelHeader(self.metadata, [(n, shape if n == name else s, q) for n, s, q in self.tensors])

    def with_types(self, qtype: GGMLQuantizationType, matrices_only: bool = True) -> ModelHeader:
        return ModelHeader(self.metadata, [(n, s, qtype if len(s) >= 2 or not matrices_only else q)
                                           for n, s, q in self.tensors])


def model_header(arch: str, *, n_layers: int = 2, n_embd: int = 256, n_heads: int = 4, n_kv_heads: int = 2,
                 n_ff: int = 512, qtype: GGMLQuantizationType = Q.Q8_0) -> ModelHeader:
    """A small model of ``arch``: matrices of ``qtype``, vectors F32, a byte-level tokenizer of 267 tokens.

    Row lengths are multiples of 256, so every GGML type's blocks fit.
    """
    head_dim = n_embd // n_heads
    meta = {k.replace("llama.", f"{arch}."): v for k, v in _tiny_metadata(n_layers, n_embd, n_heads, n_kv_heads,
                                                                         n_ff, 2048).items()}
    meta["general.architecture"] = arch
    meta[f"{arch}.attention.key_length"] = meta[f"{arch}.attention.value_length"] = head_dim
    meta.update({f"{arch}.{k}": v(n_ff) if callable(v) else v for k, v in EXTRA_METADATA.get(arch, {}).items()})
    tensors = [("token_embd.weight", (n_embd, TINY_VOCAB_SIZE), qtype)]
    for layer in range(n_layers):
        recurrent = arch in RECURRENT_LAYER_TENSORS and (layer + 1) % 2 != 0  # full_attention_interval 2
        for suffix, shape in (RECURRENT_LAYER_TENSORS if recurrent else LAYER_TENSORS)[arch].items():
            dims = shape(n_embd, n_heads, n_kv_heads, head_dim, n_ff)
            f32 = len(dims) < 2 or suffix in ALWAYS_F32
            tensors.append((f"blk.{layer}.{suffix}", dims, Q.F32 if f32 else qtype))
    tensors.append(("output_norm.weight", (n_embd,), Q.F32))
    if arch not in TIED:
        tensors.append(("output.weight", (n_embd, TINY_VOCAB_SIZE), qtype))
    return ModelHeader(meta, tensors)


def tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def header_bytes(header: ModelHeader) -> tuple[bytes, int]:
    """(the serialized header up to the tensor data, the size of the whole file it begins)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.gguf"
        _write_header(path, header)
        data = path.read_bytes()
    start = -(-len(data) // ALIGNMENT) * ALIGNMENT
    return data, start + sum(-(-tensor_nbytes(s, q) // ALIGNMENT) * ALIGNMENT for _, s, q in header.tensors)


def write_model_file(path: str | os.PathLike, header: ModelHeader) -> Path:
    """The whole file: the header, then zero tensor data (a sparse tail where the filesystem allows)."""
    data, size = header_bytes(header)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(size)
    return path


def _write_header(path: Path, header: ModelHeader) -> None:
    meta = dict(header.metadata)
    writer = GGUFWriter(str(path), meta.pop("general.architecture"))
    for key, v in meta.items():
        if not (isinstance(v, tuple) and len(v) in (2, 3) and isinstance(v[1], GGUFValueType)):
            v = (v, *_infer_type(v))
        writer.add_key_value(key, v[0], v[1], v[2] if len(v) == 3 else None)
    for name, shape, qtype in header.tensors:
        writer.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), tensor_nbytes(shape, qtype),
                               raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
