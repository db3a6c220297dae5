"""The CPU backend: the reference decoder with its matrix products run by C kernels on the packed GGUF blocks.

Weights are never dequantized or copied: each matrix is a view into the memory-mapped file, so load time is
near zero and resident memory is about the file size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..gguf_file import ModelFormatError
from .base import MemoryStats
from .cpu import kernels
from .numpy_backend import NumpyBackend


@dataclasses.dataclass(frozen=True)
class PackedMatrix:
    """A weight matrix as GGUF stores it."""

    blocks: np.ndarray  # (rows, row_bytes) uint8 view into the mmap
    qtype: int

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes


class CpuBackend(NumpyBackend):
    """C-kernel matrix products on packed blocks; everything else as the NumPy reference decoder."""

    name = "cpu"

    def load_matrix(self, name: str) -> PackedMatrix:
        qtype = int(self.gguf.tensor(name).qtype)
        if qtype not in kernels.SUPPORTED_TYPES:
            raise ModelFormatError(f"tensor {name!r} has type {self.gguf.tensor(name).qtype.name}, "
                                   "which the CPU kernels do not support")
        return PackedMatrix(self.gguf.raw(name), qtype)

    def matmul(self, x: np.ndarray, w: PackedMatrix) -> np.ndarray:
        return kernels.matmul(w.blocks, w.qtype, np.ascontiguousarray(x, dtype=np.float32))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.config.n_vocab):
            raise ValueError(f"token id out of range 0..{self.config.n_vocab - 1}")
        rows = kernels.get_rows(self.token_embd, int(self.token_embd_type), tokens)
        if self.config.embed_scale != 1.0:
            rows *= np.float32(self.config.embed_scale)
        return rows

    def memory(self) -> MemoryStats:
        return MemoryStats(weights_bytes=self.gguf.file_size, kv_cache_bytes=0)
