"""Quantize a synthetic model with llama.cpp's own quantizer, and report the tensor types a file really holds."""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path

import llama_cpp

from engine.gguf_file import GGUFFile


def quantize(src: Path, dst: Path, ftype: str) -> Path:
    """``llama_model_quantize`` of ``src`` to ``dst`` with ftype ``LLAMA_FTYPE_MOSTLY_<ftype>`` (e.g. "Q4_K_M").

    Raises RuntimeError when llama.cpp refuses (its return code is not 0).
    """
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 1
    code = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if code != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src.name} to {ftype} (return code {code})")
    return dst


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds, e.g. ``{"Q4_K": 20, "Q6_K": 5, "F32": 15}``."""
    gguf = GGUFFile(path)
    try:
        return dict(sorted(collections.Counter(info.qtype.name for info in gguf.tensors.values()).items()))
    finally:
        gguf.close()
