"""Pieces of the MLX backend: GGUF-to-MLX weight repacking, weight loading and the KV cache."""
