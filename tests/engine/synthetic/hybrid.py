"""Synthetic hybrid Gated-DeltaNet models (``qwen35``, ``qwen35moe``) as llama.cpp's loader reads them.

Layers ``il`` with ``(il + 1) % FULL_ATTN_INTERVAL != 0`` are Gated DeltaNet layers (llama.cpp's default rule
when ``attention.recurrent_layers`` is absent); the others are gated full-attention layers whose ``attn_q``
holds, per head, the query then its output gate. Names and GGML shapes follow src/models/qwen35.cpp and
qwen35moe.cpp: ``attn_qkv`` / ``attn_gate`` / ``ssm_conv1d`` / ``ssm_dt.bias`` / ``ssm_a`` / ``ssm_beta`` /
``ssm_alpha`` / ``ssm_norm`` / ``ssm_out`` for the recurrent layers, ``post_attention_norm`` before the FFN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

from tests.engine.synthetic.specs import N_CTX_TRAIN, N_EMBD
from tests.engine.synthetic.writer import _add_key, _metadata
from tests.engine.synthetic.specs import ArchSpec

N_LAYERS = 4
FULL_ATTN_INTERVAL = 4  # layers 0-2 recurrent, layer 3 attention
N_HEADS, N_KV_HEADS, HEAD_DIM = 4, 2, 64
ROPE_DIM = 16  # a quarter of the head rotates (Qwen3.5's partial_rotary_factor 0.25)
ROPE_SECTIONS = [3, 3, 2, 0]  # multi-RoPE sections; text tokens give every section the same position
N_FF = 512
SSM_D_CONV = 4
SSM_D_STATE = 64  # head_k_dim = head_v_dim
SSM_N_K_HEADS = 2  # ssm.group_count
SSM_N_V_HEADS = 4  # ssm.time_step_rank
SSM_KEY_DIM = SSM_D_STATE * SSM_N_K_HEADS
SSM_VALUE_DIM = SSM_D_STATE * SSM_N_V_HEADS  # ssm.inner_size; 256 so every K-quant fits ssm_out's rows
SSM_CONV_DIM = 2 * SSM_KEY_DIM + SSM_VALUE_DIM
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 256, 256


def is_recurrent(il: int) -> bool:
    return (il + 1) % FULL_ATTN_INTERVAL != 0


def write_hybrid(path: str | Path, arch: str = "qwen35", seed: int = 0, drop: tuple[str, ...] = (),
                 extra_tensors: dict[str, np.ndarray] | None = None, metadata: dict[str, Any] | None = None,
                 mtp: bool = False) -> Path:
    """Write a random-weight ``qwen35`` or ``qwen35moe`` model (F32) to ``path``; same arguments, same bytes.

    Args:
        mtp: add a multi-token-prediction block after the trunk (``nextn_predict_layers`` 1, block_count + 1),
            as convert_hf_to_gguf writes Qwen3.5 files by default; the main pass does not run it.
        drop: tensor names or metadata keys to leave out (malformed-model tests).
        extra_tensors: more tensors by name, numpy order (rows, row length).
        metadata: keys (full names) to add or replace.
    """
    if arch not in ("qwen35", "qwen35moe"):
        raise ValueError(f"not a hybrid architecture: {arch!r}")
    writer = GGUFWriter(str(path), arch)
    meta = _hybrid_metadata(arch)
    if mtp:
        meta.update({f"{arch}.block_count": N_LAYERS + 1, f"{arch}.nextn_predict_layers": 1})
    for key, value in {**meta, **(metadata or {})}.items():
        if key not in drop:
            _add_key(writer, key, value)
    rng = np.random.default_rng(seed)
    tensors = _tensors(arch, rng)
    if mtp:
        tensors.update(_mtp_tensors(arch, rng))
    for name, values in {**tensors, **(extra_tensors or {})}.items():
        if name not in drop:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _hybrid_metadata(arch: str) -> dict[str, Any]:
    meta = _metadata(ArchSpec(arch, arch))
    a = arch
    meta.update({
        f"{a}.block_count": N_LAYERS,
        f"{a}.context_length": N_CTX_TRAIN,
        f"{a}.feed_forward_length": N_FF,
        f"{a}.attention.head_count": N_HEADS,
        f"{a}.attention.head_count_kv": N_KV_HEADS,
        f"{a}.attention.key_length": HEAD_DIM,
        f"{a}.attention.value_length": HEAD_DIM,
        f"{a}.rope.dimension_count": ROPE_DIM,
        f"{a}.rope.freq_base": 10000000.0,
        f"{a}.rope.dimension_sections": (ROPE_SECTIONS, _int32()),
        f"{a}.full_attention_interval": FULL_ATTN_INTERVAL,
        f"{a}.ssm.conv_kernel": SSM_D_CONV,
        f"{a}.ssm.state_size": SSM_D_STATE,
        f"{a}.ssm.group_count": SSM_N_K_HEADS,
        f"{a}.ssm.time_step_rank": SSM_N_V_HEADS,
        f"{a}.ssm.inner_size": SSM_VALUE_DIM,
    })
    if arch == "qwen35moe":
        meta.update({f"{a}.expert_count": N_EXPERT, f"{a}.expert_used_count": N_EXPERT_USED,
                     f"{a}.expert_feed_forward_length": N_FF_EXP,
                     f"{a}.expert_shared_feed_forward_length": N_FF_SHEXP})
    return meta


def _int32():
    from gguf import GGUFValueType

    return GGUFValueType.INT32


def _tensors(arch: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from tests.engine.gguf_builders import tiny_vocab

    n_vocab = len(tiny_vocab()[0])

    def matrix(rows: int, cols: int, gain: float) -> np.ndarray:
        return gain / np.sqrt(cols) * rng.standard_normal((rows, cols))

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    out = {"token_embd.weight": rng.standard_normal((n_vocab, N_EMBD))}
    for il in range(N_LAYERS):
        p = f"blk.{il}."
        out[p + "attn_norm.weight"] = norm(N_EMBD)
        if is_recurrent(il):
            out.update(_deltanet_tensors(p, rng, matrix, norm))
        else:
            out[p + "attn_q.weight"] = matrix(2 * N_HEADS * HEAD_DIM, N_EMBD, 1.6)  # per head: query, then gate
            out[p + "attn_k.weight"] = matrix(N_KV_HEADS * HEAD_DIM, N_EMBD, 1.6)
            out[p + "attn_v.weight"] = matrix(N_KV_HEADS * HEAD_DIM, N_EMBD, 1.0)
            out[p + "attn_q_norm.weight"], out[p + "attn_k_norm.weight"] = norm(HEAD_DIM), norm(HEAD_DIM)
            out[p + "attn_output.weight"] = matrix(N_EMBD, N_HEADS * HEAD_DIM, 1.0)
        out[p + "post_attention_norm.weight"] = norm(N_EMBD)
        if arch == "qwen35moe":
            out.update(_moe_tensors(p, rng, matrix))
        else:
            out[p + "ffn_gate.weight"], out[p + "ffn_up.weight"] = matrix(N_FF, N_EMBD, 1.0), matrix(N_FF, N_EMBD, 1.0)
            out[p + "ffn_down.weight"] = matrix(N_EMBD, N_FF, 0.7)
    out["output_norm.weight"] = norm(N_EMBD)
    out["output.weight"] = matrix(n_vocab, N_EMBD, 3.0)
    return out


def _deltanet_tensors(p: str, rng: np.random.Generator, matrix, norm) -> dict[str, np.ndarray]:
    """One Gated DeltaNet layer; the decay gate (ssm_a = -exp(A_log), ssm_dt bias) keeps memory over tens of
    tokens, so the state, not only the conv window, shapes the output."""
    return {
        p + "attn_qkv.weight": matrix(SSM_CONV_DIM, N_EMBD, 1.0),
        p + "attn_gate.weight": matrix(SSM_VALUE_DIM, N_EMBD, 1.0),
        p + "ssm_conv1d.weight": 0.5 * rng.standard_normal((SSM_CONV_DIM, SSM_D_CONV)),
        p + "ssm_dt.bias": rng.uniform(-2.0, 0.0, SSM_N_V_HEADS),
        p + "ssm_a": -np.exp(rng.uniform(-2.0, 0.5, SSM_N_V_HEADS)),
        p + "ssm_beta.weight": matrix(SSM_N_V_HEADS, N_EMBD, 1.0),
        p + "ssm_alpha.weight": matrix(SSM_N_V_HEADS, N_EMBD, 1.0),
        p + "ssm_norm.weight": norm(SSM_D_STATE),
        p + "ssm_out.weight": matrix(N_EMBD, SSM_VALUE_DIM, 1.0),
    }


def _moe_tensors(p: str, rng: np.random.Generator, matrix) -> dict[str, np.ndarray]:
    """Routed experts (3-D, numpy order) and the sigmoid-gated shared expert of qwen35moe."""
    return {
        p + "ffn_gate_inp.weight": matrix(N_EXPERT, N_EMBD, 4.0),
        p + "ffn_gate_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, 1.0) for _ in range(N_EXPERT)]),
        p + "ffn_up_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, 1.0) for _ in range(N_EXPERT)]),
        p + "ffn_down_exps.weight": np.stack([matrix(N_EMBD, N_FF_EXP, 0.5) for _ in range(N_EXPERT)]),
        p + "ffn_gate_inp_shexp.weight": matrix(1, N_EMBD, 1.0)[0],
        p + "ffn_gate_shexp.weight": matrix(N_FF_SHEXP, N_EMBD, 1.0),
        p + "ffn_up_shexp.weight": matrix(N_FF_SHEXP, N_EMBD, 1.0),
        p + "ffn_down_shexp.weight": matrix(N_EMBD, N_FF_SHEXP, 0.5),
    }


def _mtp_tensors(arch: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """blk.N_LAYERS: a gated full-attention block and its NextN projections (src/models/qwen35.cpp)."""
    p = f"blk.{N_LAYERS}."
    out = {p + "attn_norm.weight": np.ones(N_EMBD), p + "post_attention_norm.weight": np.ones(N_EMBD),
           p + "attn_q.weight": 0.05 * rng.standard_normal((2 * N_HEADS * HEAD_DIM, N_EMBD)),
           p + "attn_k.weight": 0.05 * rng.standard_normal((N_KV_HEADS * HEAD_DIM, N_EMBD)),
           p + "attn_v.weight": 0.05 * rng.standard_normal((N_KV_HEADS * HEAD_DIM, N_EMBD)),
           p + "attn_output.weight": 0.05 * rng.standard_normal((N_EMBD, N_HEADS * HEAD_DIM)),
           p + "attn_q_norm.weight": np.ones(HEAD_DIM), p + "attn_k_norm.weight": np.ones(HEAD_DIM),
           p + "nextn.eh_proj.weight": 0.05 * rng.standard_normal((N_EMBD, 2 * N_EMBD)),
           p + "nextn.enorm.weight": np.ones(N_EMBD), p + "nextn.hnorm.weight": np.ones(N_EMBD)}
    if arch == "qwen35moe":
        out.update(_moe_tensors(p, rng, lambda rows, cols, gain: gain / np.sqrt(cols) * rng.standard_normal((rows, cols))))
    else:
        out.update({p + "ffn_gate.weight": 0.05 * rng.standard_normal((N_FF, N_EMBD)),
                    p + "ffn_up.weight": 0.05 * rng.standard_normal((N_FF, N_EMBD)),
                    p + "ffn_down.weight": 0.05 * rng.standard_normal((N_EMBD, N_FF))})
    return out
