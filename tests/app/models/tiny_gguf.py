"""Tiny random-weight GGUF files for model-manager tests, written with ``gguf.GGUFWriter``.

Each is a whole model of its architecture (every tensor llama.cpp names for it, ``tests/engine/header_builders``)
with a byte-level tokenizer of 267 tokens, so the engine's verdict is "runs" for an architecture it supports.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.engine.gguf_builders import TINY_VOCAB_SIZE, tiny_vocab
from tests.engine.header_builders import LAYER_TENSORS, TIED

N_HEADS, N_KV_HEADS = 4, 2


def write_tiny_gguf(path: Path, *, arch: str = "llama", name: str = "Tiny", n_layers: int = 2, n_embd: int = 32,
                    n_ctx_train: int = 256, chat_template: str | None = "{{ messages }}",
                    file_type: int | None = 0, sliding_window: int = 0, extra_bytes: int = 0, seed: int = 0) -> Path:
    """Write a small but valid GGUF of ``arch``; ``extra_bytes`` more of weights make it bigger for download tests.

    Four heads, two KV heads (head_dim ``n_embd // 4``), F32 weights, an FFN of ``2 * n_embd`` widened by
    ``extra_bytes`` (every tensor is one the architecture has: the engine refuses tensors it does not know).
    """
    rng = np.random.default_rng(seed)
    n_ff = ffn_length(n_layers, n_embd, extra_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(n_layers)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_context_length(n_ctx_train)
    if sliding_window:
        writer.add_sliding_window(sliding_window)
    if file_type is not None:
        writer.add_file_type(file_type)
    tokens, types, merges = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for tensor, shape in _tensor_shapes(arch, n_layers, n_embd, n_ff):
        values = rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02 if len(shape) > 1 else np.ones(shape, np.float32)
        writer.add_tensor(tensor, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ffn_length(n_layers: int, n_embd: int, extra_bytes: int = 0) -> int:
    """``2 * n_embd``, plus what makes the FFN matrices (three per layer, float32) ``extra_bytes`` larger."""
    return 2 * n_embd + -(-extra_bytes // (3 * n_layers * n_embd * 4))


def _tensor_shapes(arch: str, n_layers: int, n_embd: int, n_ff: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, GGML shape) of every tensor of a tiny ``arch`` model (an unknown architecture gets llama's)."""
    head_dim = n_embd // N_HEADS
    shapes = [("token_embd.weight", (n_embd, TINY_VOCAB_SIZE))]
    for layer in range(n_layers):
        shapes += [(f"blk.{layer}.{suffix}", shape(n_embd, N_HEADS, N_KV_HEADS, head_dim, n_ff))
                   for suffix, shape in LAYER_TENSORS.get(arch, LAYER_TENSORS["llama"]).items()]
    shapes.append(("output_norm.weight", (n_embd,)))
    if arch not in TIED:
        shapes.append(("output.weight", (n_embd, TINY_VOCAB_SIZE)))
    return shapes


def parameter_count(arch: str = "llama", n_layers: int = 2, n_embd: int = 32, extra_bytes: int = 0) -> int:
    """The parameters of ``write_tiny_gguf``'s model."""
    n_ff = ffn_length(n_layers, n_embd, extra_bytes)
    return sum(int(np.prod(shape)) for _, shape in _tensor_shapes(arch, n_layers, n_embd, n_ff))
