"""Compute backends behind one contract (see base.py): NumPy reference, C kernels, MLX."""

from __future__ import annotations

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .base import Backend

BACKENDS = ("auto", "numpy", "cpu", "mlx")


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""


def create_backend(name: str, gguf: GGUFFile, config: ModelConfig,
                   n_ctx: int | None = None) -> tuple[Backend, str | None]:
    """Build the named backend. Returns the backend and a notice for the user when it fell back.

    "auto" picks MLX on Apple Silicon with Metal, else the C kernels, else NumPy. ``n_ctx`` is the context
    the model is loaded for: LongRoPE models (phi3) rotate with long or short factors by it (rope.rope_tables).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name in ("auto", "mlx"):
        from . import platform_mlx
        reason = platform_mlx.unavailable_reason(require_metal=name == "auto")
        if reason is None:
            from .mlx_backend import MlxBackend
            return MlxBackend(gguf, config, n_ctx=n_ctx), None
        if name == "mlx":
            raise BackendUnavailableError(f"the MLX backend cannot run here: {reason}")
    if name in ("auto", "cpu"):
        from .cpu import kernels
        if kernels.AVAILABLE:
            from .cpu_backend import CpuBackend
            return CpuBackend(gguf, config), None
        notice = ("The fast CPU kernels are not available (the C extension was not built or was disabled); "
                  "using the slower NumPy backend.")
        from .numpy_backend import NumpyBackend
        return NumpyBackend(gguf, config, n_ctx), notice
    from .numpy_backend import NumpyBackend
    return NumpyBackend(gguf, config, n_ctx), None
