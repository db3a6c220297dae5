"""Tiny random-weight GGUF files for model-manager tests, written with ``gguf.GGUFWriter``."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_tiny_gguf(path: Path, *, arch: str = "llama", name: str = "Tiny", n_layers: int = 2, n_embd: int = 32,
                    n_vocab: int = 64, n_ctx_train: int = 256, chat_template: str | None = "{{ messages }}",
                    file_type: int | None = 0, sliding_window: int = 0, extra_bytes: int = 0, seed: int = 0) -> Path:
    """Write a small but valid GGUF of ``arch``; ``extra_bytes`` of random float32 pad it for download tests."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(n_layers)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(n_ctx_train)
    if sliding_window:
        writer.add_sliding_window(sliding_window)
    if file_type is not None:
        writer.add_file_type(file_type)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32))
    for layer in range(n_layers):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(n_embd, np.float32))
    if extra_bytes:
        writer.add_tensor("pad.weight", rng.standard_normal(max(1, extra_bytes // 4 // 32) * 32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
