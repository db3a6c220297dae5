"""Compute backends behind one contract (see base.py): NumPy reference, C kernels, MLX."""

from __future__ import annotations

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .base import Backend

BACKENDS = ("auto", "numpy", "cpu", "mlx")
KV_TYPES = ("f16", "f32", "q8_0")  # the cpu backend's KV cache element types (llama.cpp's -ctk / -ctv names)


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""


def resolve_backend(name: str) -> tuple[str, str | None]:
    """The backend ``create_backend(name, ...)`` builds on this machine, and the notice when it fell back.

    "auto" picks MLX on Apple Silicon with Metal, else the C kernels, else NumPy; "cpu" falls back to NumPy
    when the C extension is not built.

    Raises:
        ValueError: an unknown backend name.
        BackendUnavailableError: "mlx" was asked for and cannot run here.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    if name in ("auto", "mlx"):
        from . import platform_mlx
        reason = platform_mlx.unavailable_reason(require_metal=name == "auto")
        if reason is None:
            return "mlx", None
        if name == "mlx":
            raise BackendUnavailableError(f"the MLX backend cannot run here: {reason}")
    if name in ("auto", "cpu"):
        from .cpu import kernels
        if kernels.AVAILABLE:
            return "cpu", None
        return "numpy", ("The fast CPU kernels are not available (the C extension was not built or was disabled); "
                         "using the slower NumPy backend.")
    return "numpy", None


def create_backend(name: str, gguf: GGUFFile, config: ModelConfig, n_ctx: int | None = None,
                   kv_type: str | None = None) -> tuple[Backend, str | None]:
    """Build the named backend (see ``resolve_backend``). Returns the backend and a notice for the user when it
    fell back. ``n_ctx`` is the context the model is loaded for: LongRoPE models (phi3) rotate with long or short
    factors by it (rope.rope_tables). ``kv_type``: the KV cache's element type, ``"f16"``, ``"f32"`` or
    ``"q8_0"`` (llama.cpp's ``-ctk``/``-ctv`` names); None is the backend's own. Only the CPU backend's fused
    decoder takes a choice: any other backend raises ValueError for one."""
    chosen, notice = resolve_backend(name)
    if kv_type is not None and chosen != "cpu":
        raise ValueError(f"the KV cache type {kv_type!r} is an option of the cpu backend only; "
                         f"the {chosen} backend keeps its own")
    if chosen == "mlx":
        from .mlx_backend import MlxBackend
        return MlxBackend(gguf, config, n_ctx=n_ctx), notice
    if chosen == "cpu":
        from .cpu_backend import CpuBackend
        if kv_type is None:
            return CpuBackend(gguf, config, n_ctx=n_ctx), notice
        return CpuBackend(gguf, config, kv_dtype=kv_type, n_ctx=n_ctx), notice
    from .numpy_backend import NumpyBackend
    return NumpyBackend(gguf, config, n_ctx), notice
