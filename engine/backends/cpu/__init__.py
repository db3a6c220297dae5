"""Fast CPU kernels: matrix products on packed GGUF blocks (C extension with a NumPy fallback)."""
