"""A synthetic dense Gemma 4 model, with the tensors and keys llama.cpp's gemma4 loader reads (src/models/gemma4.cpp).

What it exercises beyond gemma3: sliding and full layers of different head widths and RoPE dimensions, a
``rope_freqs`` tensor on the full layers only (proportional RoPE), unit attention scale, values RMS-normed
without a weight, a full layer without ``attn_v`` (its keys are its values), per-layer embeddings
(``per_layer_token_embd`` + ``per_layer_model_proj`` and each layer's ``inp_gate`` / ``proj`` / ``post_norm``),
``layer_output_scale``, the last layers reading the KV cache of earlier ones (``shared_kv_layers``), KV heads
by layer kind and a double-wide FFN in the shared layers (per-layer ``head_count_kv`` / ``feed_forward_length``
arrays, as the converter writes for the 31B and E2B models) and the final logit soft-capping. Six layers,
sliding pattern (sliding, sliding, full) twice; layers 3 to 5 share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from tests.engine.gguf_builders import CHATML_TEMPLATE, tiny_vocab
from tests.engine.synthetic.writer import _add_key

ARCH = "gemma4"
N_LAYERS = 6
N_EMBD = 256
N_HEADS = 4
N_KV_HEADS = 2  # sliding layers
N_KV_HEADS_FULL = 1  # full layers
HEAD_DIM = 128  # full-attention layers
HEAD_DIM_SWA = 64  # sliding-window layers
N_FF = 512
N_FF_SHARED = 1024  # the shared-KV layers' double-wide FFN
N_EMBD_PER_LAYER = 256  # a multiple of 256, so every K-quant takes the per-layer projections
N_KV_SHARED = 3
SLIDING_WINDOW = 16
SWA_LAYERS = [True, True, False, True, True, False]
NO_V_LAYER = 2  # a full layer without attn_v: llama.cpp uses its keys (before the k norm) as values
FINAL_SOFTCAP = 8.0
N_EXPERT = 8  # the mixture variant (26B-A4B's FFN): a dense FFN beside 8 experts, 2 used
N_EXPERT_USED = 2
N_FF_EXP = 256


def rope_freq_factors() -> np.ndarray:
    """Proportional RoPE of the full layers: the first quarter of the pairs turn, the rest barely (1e30 would stop
    them; moderate factors keep every dimension meaningful for the test)."""
    n = HEAD_DIM // 2
    return np.where(np.arange(n) < n // 4, 1.0, 1.0 + 3.0 * np.arange(n) / n)


def write_gemma4(path: str | Path, seed: int = 0, drop: tuple[str, ...] = (), moe: bool = False,
                 extra_tensors: dict[str, np.ndarray] | None = None, metadata: dict[str, Any] | None = None) -> Path:
    """Write the synthetic Gemma 4 model (F32) to ``path``; ``moe``: every layer's FFN has experts beside the
    dense one (the 26B-A4B layout); ``drop`` leaves out tensors or keys by name, ``extra_tensors`` /
    ``metadata`` add or replace them (for tests of malformed files)."""
    writer = GGUFWriter(str(path), ARCH)
    moe_keys = {f"{ARCH}.expert_count": N_EXPERT, f"{ARCH}.expert_used_count": N_EXPERT_USED,
                f"{ARCH}.expert_feed_forward_length": N_FF_EXP} if moe else {}
    for key, value in {**_metadata(), **moe_keys, **(metadata or {})}.items():
        if key not in drop:
            _add_key(writer, key, value)
    tensors = {**_tensors(np.random.default_rng(seed), moe), **(extra_tensors or {})}
    for name, values in tensors.items():
        if name not in drop:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _metadata() -> dict[str, Any]:
    tokens, types, merges = tiny_vocab()
    a = ARCH
    return {
        "general.name": "hearth synthetic model",
        f"{a}.vocab_size": len(tokens),
        f"{a}.context_length": 4096,
        f"{a}.embedding_length": N_EMBD,
        f"{a}.block_count": N_LAYERS,
        f"{a}.feed_forward_length": [N_FF if il < N_LAYERS - N_KV_SHARED else N_FF_SHARED for il in range(N_LAYERS)],
        f"{a}.attention.head_count": N_HEADS,
        f"{a}.attention.head_count_kv": [N_KV_HEADS if swa else N_KV_HEADS_FULL for swa in SWA_LAYERS],
        f"{a}.attention.key_length": HEAD_DIM,
        f"{a}.attention.value_length": HEAD_DIM,
        f"{a}.attention.key_length_swa": HEAD_DIM_SWA,
        f"{a}.attention.value_length_swa": HEAD_DIM_SWA,
        f"{a}.rope.dimension_count": HEAD_DIM,
        f"{a}.rope.dimension_count_swa": HEAD_DIM_SWA,
        f"{a}.rope.freq_base": 1000000.0,
        f"{a}.rope.freq_base_swa": 10000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.attention.sliding_window": SLIDING_WINDOW,
        f"{a}.attention.sliding_window_pattern": (SWA_LAYERS, GGUFValueType.BOOL),
        f"{a}.attention.shared_kv_layers": N_KV_SHARED,
        f"{a}.embedding_length_per_layer_input": N_EMBD_PER_LAYER,
        f"{a}.final_logit_softcapping": FINAL_SOFTCAP,
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


def _tensors(rng: np.random.Generator, moe: bool) -> dict[str, np.ndarray]:
    """Every tensor by name, numpy order (rows, row length)."""
    n_vocab = len(tiny_vocab()[0])

    def matrix(rows: int, cols: int, gain: float) -> np.ndarray:
        return gain / np.sqrt(cols) * rng.standard_normal((rows, cols))

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    out = {
        "token_embd.weight": 3.0 / np.sqrt(N_EMBD) * rng.standard_normal((n_vocab, N_EMBD)),
        "per_layer_token_embd.weight": 0.1 * rng.standard_normal((n_vocab, N_EMBD_PER_LAYER * N_LAYERS)),
        "per_layer_model_proj.weight": matrix(N_EMBD_PER_LAYER * N_LAYERS, N_EMBD, 1.0),
        "per_layer_proj_norm.weight": norm(N_EMBD_PER_LAYER),
        "rope_freqs.weight": rope_freq_factors(),
    }
    n_kv_layers = N_LAYERS - N_KV_SHARED
    for il in range(N_LAYERS):
        p = f"blk.{il}."
        hd = HEAD_DIM_SWA if SWA_LAYERS[il] else HEAD_DIM
        n_kv = N_KV_HEADS if SWA_LAYERS[il] else N_KV_HEADS_FULL
        n_ff = N_FF if il < n_kv_layers else N_FF_SHARED
        out[p + "attn_norm.weight"] = norm(N_EMBD)
        out[p + "attn_q.weight"] = matrix(N_HEADS * hd, N_EMBD, 1.6)
        # the attention scale is 1: the q norm's weights make the scores' spread about 2, as trained ones would
        out[p + "attn_q_norm.weight"] = 2.0 / np.sqrt(hd) * norm(hd)
        if il < n_kv_layers:  # the shared layers read an earlier layer's cache: no k / v of their own
            out[p + "attn_k.weight"] = matrix(n_kv * hd, N_EMBD, 1.6)
            out[p + "attn_k_norm.weight"] = norm(hd)
            if il != NO_V_LAYER:
                out[p + "attn_v.weight"] = matrix(n_kv * hd, N_EMBD, 1.0)
        out[p + "attn_output.weight"] = matrix(N_EMBD, N_HEADS * hd, 0.7)
        out[p + "post_attention_norm.weight"] = norm(N_EMBD)
        out[p + "ffn_norm.weight"] = norm(N_EMBD)
        out[p + "ffn_gate.weight"] = matrix(n_ff, N_EMBD, 1.0)
        out[p + "ffn_up.weight"] = matrix(n_ff, N_EMBD, 1.0)
        out[p + "ffn_down.weight"] = matrix(N_EMBD, n_ff, 0.7)
        out[p + "post_ffw_norm.weight"] = norm(N_EMBD)
        if moe:
            out.update(_expert_tensors(p, matrix, norm, rng))
        out[p + "inp_gate.weight"] = matrix(N_EMBD_PER_LAYER, N_EMBD, 1.0)
        out[p + "proj.weight"] = matrix(N_EMBD, N_EMBD_PER_LAYER, 0.7)
        out[p + "post_norm.weight"] = 0.5 * norm(N_EMBD)
        out[p + "layer_output_scale.weight"] = np.array([0.6 + 0.1 * il])
    out["output_norm.weight"] = norm(N_EMBD)
    return out


def _expert_tensors(p: str, matrix, norm, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The experts beside the dense FFN, with their norms, the router's input scale and the per-expert output
    scale. The router sees rms_norm(x) / sqrt(n_embd) * scale: its gain makes the logits' spread about 4, so that near-ties are rare."""
    return {
        p + "ffn_gate_inp.weight": matrix(N_EXPERT, N_EMBD, 16.0),
        p + "ffn_gate_inp.scale": 4.0 * norm(N_EMBD),
        p + "ffn_gate_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, 1.0) for _ in range(N_EXPERT)]),
        p + "ffn_up_exps.weight": np.stack([matrix(N_FF_EXP, N_EMBD, 1.0) for _ in range(N_EXPERT)]),
        p + "ffn_down_exps.weight": np.stack([matrix(N_EMBD, N_FF_EXP, 0.7) for _ in range(N_EXPERT)]),
        p + "ffn_down_exps.scale": 1.0 + 0.3 * rng.standard_normal(N_EXPERT),
        p + "pre_ffw_norm_2.weight": norm(N_EMBD),
        p + "post_ffw_norm_1.weight": norm(N_EMBD),
        p + "post_ffw_norm_2.weight": 0.4 * norm(N_EMBD),  # a smaller share: quantized routing near-ties move less
    }
