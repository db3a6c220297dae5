"""Write a synthetic model of an ``ArchSpec`` as an F32 GGUF with ``gguf.GGUFWriter``.

Tensor names, GGML shapes and metadata keys are the ones llama.cpp's loader reads for the architecture
(src/models/<arch>.cpp); the tokenizer is the tiny byte-level GPT-2 vocabulary of ``gguf_builders``
(parity is on token ids, so any vocabulary llama.cpp accepts will do). Weights are random with scales
chosen so that attention is far from uniform and the logits' spread over the vocabulary is a few units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from tests.engine.gguf_builders import CHATML_TEMPLATE, tiny_vocab
from tests.engine.synthetic.specs import (HEAD_DIM, N_CTX_TRAIN, N_EMBD, N_FF, N_FF_SHEXP, N_HEADS, N_KV_HEADS,
                                          N_LAYERS, N_FF_EXP, ArchSpec, llama3_factors)

N_Q = N_HEADS * HEAD_DIM
N_KV = N_KV_HEADS * HEAD_DIM


def write_synthetic(path: str | Path, spec: ArchSpec, seed: int = 0, drop: tuple[str, ...] = (),
                    extra_tensors: dict[str, np.ndarray] | None = None, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``spec``'s model to ``path`` (F32 weights; the same arguments give the same bytes).

    Args:
        drop: tensor names or metadata keys to leave out (for tests of malformed models).
        extra_tensors: more tensors to write, by name, numpy order (rows, row length).
        metadata: keys (full names) to add or replace.
    """
    writer = GGUFWriter(str(path), spec.arch)
    for key, value in {**_metadata(spec), **(metadata or {})}.items():
        if key not in drop:
            _add_key(writer, key, value)
    rng = np.random.default_rng(seed)
    tensors = {**_tensors(spec, rng), **(extra_tensors or {})}
    for name, values in tensors.items():
        if name not in drop:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _metadata(spec: ArchSpec) -> dict[str, Any]:
    tokens, types, merges = tiny_vocab()
    a = spec.arch
    meta: dict[str, Any] = {
        "general.name": "hearth synthetic model",  # not the arch: llama.cpp patches "phi3"-named vocabularies
        f"{a}.vocab_size": len(tokens),
        f"{a}.context_length": N_CTX_TRAIN,
        f"{a}.embedding_length": N_EMBD,
        f"{a}.block_count": N_LAYERS,
        f"{a}.feed_forward_length": N_FF,
        f"{a}.attention.head_count": N_HEADS,
        f"{a}.attention.head_count_kv": N_KV_HEADS,
        f"{a}.attention.key_length": HEAD_DIM,
        f"{a}.attention.value_length": HEAD_DIM,
        f"{a}.rope.dimension_count": spec.rope_dim,
        f"{a}.rope.freq_base": 10000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": (types, GGUFValueType.INT32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }
    meta.update({f"{a}.{key}": value for key, value in spec.metadata.items()})
    return meta


def _add_key(writer: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, tuple):  # (values, element type) of an array
        writer.add_key_value(key, value[0], GGUFValueType.ARRAY, value[1])
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        element = GGUFValueType.STRING if isinstance(value[0], str) else GGUFValueType.INT32
        writer.add_key_value(key, value, GGUFValueType.ARRAY, element)
    else:
        raise TypeError(f"no GGUF type for {key} = {value!r}")


def _tensors(spec: ArchSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every tensor by name, numpy order (rows, row length)."""
    n_vocab = len(tiny_vocab()[0])

    def matrix(rows: int, cols: int, gain: float) -> np.ndarray:
        return gain / np.sqrt(cols) * rng.standard_normal((rows, cols))

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    out = {"token_embd.weight": spec.embed_std * rng.standard_normal((n_vocab, N_EMBD))}
    for il in range(N_LAYERS):
        p = f"blk.{il}."
        if spec.pre_norms:
            out[p + "attn_norm.weight"] = norm(N_EMBD)
        q, k, v = matrix(N_Q, N_EMBD, 1.6), matrix(N_KV, N_EMBD, 1.6), matrix(N_KV, N_EMBD, 1.0)
        if spec.fused_qkv:
            out[p + "attn_qkv.weight"] = np.concatenate([q, k, v])
        else:
            out[p + "attn_q.weight"], out[p + "attn_k.weight"], out[p + "attn_v.weight"] = q, k, v
        if spec.qkv_bias:
            for part, n in (("q", N_Q), ("k", N_KV), ("v", N_KV)):
                out[p + f"attn_{part}.bias"] = 0.3 * rng.standard_normal(n)
        if spec.attn_sinks:  # per-head sink logits of the size of the scores, so they take a visible share
            out[p + "attn_sinks.weight"] = 2.0 + rng.standard_normal(N_HEADS)
        if spec.qk_norm == "head":
            out[p + "attn_q_norm.weight"], out[p + "attn_k_norm.weight"] = norm(HEAD_DIM), norm(HEAD_DIM)
        elif spec.qk_norm == "whole":
            out[p + "attn_q_norm.weight"], out[p + "attn_k_norm.weight"] = norm(N_Q), norm(N_KV)
        out[p + "attn_output.weight"] = matrix(N_EMBD, N_Q, 0.7)
        if spec.attn_out_bias:
            out[p + "attn_output.bias"] = 0.2 * rng.standard_normal(N_EMBD)
        if spec.post_norms:
            out[p + "post_attention_norm.weight"] = norm(N_EMBD)
        if spec.pre_norms:
            out[p + f"{spec.ffn_norm_name}.weight"] = norm(N_EMBD)
        if spec.n_expert:
            out.update(_expert_tensors(p, spec, matrix, rng))
        else:
            out.update(_dense_ffn_tensors(p, spec, matrix))
        if spec.post_norms:
            out[p + "post_ffw_norm.weight"] = norm(N_EMBD)
    out["output_norm.weight"] = norm(N_EMBD)
    if not spec.tied:
        out["output.weight"] = matrix(n_vocab, N_EMBD, 3.0)
    if spec.rope_freqs:
        out["rope_freqs.weight"] = np.array(llama3_factors(base=10000.0, orig_ctx=64))
    if spec.longrope:
        n = spec.rope_dim // 2
        out["rope_factors_short.weight"] = 1.0 + 0.5 * np.linspace(0, 1, n)
        out["rope_factors_long.weight"] = 1.0 + 20.0 * np.linspace(0, 1, n) ** 2
    return out


def _dense_ffn_tensors(p: str, spec: ArchSpec, matrix) -> dict[str, np.ndarray]:
    out = {}
    gate, up = matrix(N_FF, N_EMBD, 1.0), matrix(N_FF, N_EMBD, 1.0)
    if spec.fused_up:
        out[p + "ffn_up.weight"] = np.concatenate([gate, up])
    else:
        out[p + "ffn_gate.weight"], out[p + "ffn_up.weight"] = gate, up
    out[p + "ffn_down.weight"] = matrix(N_EMBD, N_FF, 0.7)
    return out


def _expert_tensors(p: str, spec: ArchSpec, matrix, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The router (n_expert, n_embd) and the experts stacked in 3-D tensors (n_expert, rows, row length), numpy
    order; the router's gain spreads the routing so that different tokens choose different experts. gpt-oss's
    gate gain puts about one per cent of the gate values past its SwiGLU clamp (7): without the clamp the F32
    logits move by 0.8 (tests/engine/test_gpt_oss.py holds F32 to 0.05); more would make the quantized files
    too sensitive for the parity criterion."""
    n = spec.n_expert
    gate_gain, up_gain = (3.0, 1.0) if spec.moe_biases else (1.0, 1.0)
    out = {
        p + "ffn_gate_inp.weight": matrix(n, N_EMBD, 4.0),
        p + "ffn_gate_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, gate_gain) for _ in range(n)]),
        p + "ffn_up_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, up_gain) for _ in range(n)]),
        p + "ffn_down_exps.weight": np.stack([matrix(N_EMBD, N_FF_EXP, 0.5 / (gate_gain * up_gain))
                                              for _ in range(n)]),
    }
    if spec.moe_biases:
        out[p + "ffn_gate_inp.bias"] = 0.5 * rng.standard_normal(n)
        out[p + "ffn_gate_exps.bias"] = 0.5 * rng.standard_normal((n, N_FF_EXP))
        out[p + "ffn_up_exps.bias"] = 0.3 * rng.standard_normal((n, N_FF_EXP))
        out[p + "ffn_down_exps.bias"] = 0.2 * rng.standard_normal((n, N_EMBD))
    if spec.shared_expert:
        out[p + "ffn_gate_inp_shexp.weight"] = 2.0 / np.sqrt(N_EMBD) * rng.standard_normal(N_EMBD)
        out[p + "ffn_gate_shexp.weight"] = matrix(N_FF_SHEXP, N_EMBD, 1.0)
        out[p + "ffn_up_shexp.weight"] = matrix(N_FF_SHEXP, N_EMBD, 1.0)
        out[p + "ffn_down_shexp.weight"] = matrix(N_EMBD, N_FF_SHEXP, 0.5)
    return out
