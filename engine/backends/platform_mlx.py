"""The platform checks MLX needs (Apple Silicon, Metal, memory limits), in one small module so tests can fake them.

On a Mac the GPU shares memory with everything else, and Metal tells how much of it a process should keep
resident (``max_recommended_working_set_size``). A model whose weights exceed that is refused before any
weight is loaded, with a message saying so; one that fits has its memory wired (``mx.set_wired_limit``) so
macOS does not page it out between tokens. Off Metal (MLX's CPU device) the limit is the available memory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import platform
import sys

import psutil

GB = 1e9


class ModelDoesNotFitError(MemoryError):
    """The model needs more memory than this device can keep resident; the message gives both sizes."""


@dataclasses.dataclass(frozen=True)
class MetalMemory:
    """What Metal reports about unified memory."""

    total_bytes: int  # memory_size
    recommended_bytes: int  # max_recommended_working_set_size: what one process should keep resident


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def unavailable_reason(require_metal: bool) -> str | None:
    """Why MLX cannot be used here, or None when it can.

    Args:
        require_metal: also require an Apple-Silicon Mac with Metal (what ``backend="auto"`` wants);
            without it, MLX's CPU device (``mlx[cpu]`` on Linux) is accepted.
    """
    if require_metal and not is_apple_silicon():
        return "MLX with Metal needs a Mac with Apple Silicon"
    try:
        import mlx.core as mx
    except ImportError as e:
        return f"the mlx package is not installed ({e})"
    if require_metal and not mx.metal.is_available():
        return "Metal is not available"
    return None


def default_device_is_gpu() -> bool:
    """Whether MLX computes on the GPU (Metal) by default here; False on MLX's CPU device (``mlx[cpu]``)."""
    import mlx.core as mx
    return mx.default_device().type == mx.gpu


def metal_memory() -> MetalMemory | None:
    """Metal's memory figures on an Apple-Silicon Mac with Metal, else None."""
    if not is_apple_silicon():
        return None
    import mlx.core as mx
    if not mx.metal.is_available():
        return None
    info = mx.device_info()  # mx.metal.device_info() before MLX 0.29, now deprecated
    return MetalMemory(int(info["memory_size"]), int(info["max_recommended_working_set_size"]))


def check_fits(needed_bytes: int, what: str) -> None:
    """Raise ModelDoesNotFitError when ``needed_bytes`` exceed what this device can keep resident.

    Args:
        needed_bytes: the bytes about to be allocated (the model's weights in MLX form).
        what: names the thing in the message, e.g. the model file.
    """
    metal = metal_memory()
    if metal is not None:
        limit, where = metal.recommended_bytes, "the GPU's recommended working set"
    else:
        limit, where = psutil.virtual_memory().available, "the memory available now"
    if needed_bytes > limit:
        raise ModelDoesNotFitError(
            f"{what} needs {needed_bytes / GB:.1f} GB for its weights alone, but {where} is {limit / GB:.1f} GB; "
            "choose a smaller model or a smaller quantization")


def wire_memory(needed_bytes: int) -> int | None:
    """Keep up to ``needed_bytes`` wired on Metal (never more than the recommended working set).

    Returns:
        The previous wired limit, to pass to ``restore_wired_limit``; None off Metal (nothing was changed).
    """
    metal = metal_memory()
    if metal is None:
        return None
    import mlx.core as mx
    return mx.set_wired_limit(min(needed_bytes, metal.recommended_bytes))


def restore_wired_limit(previous: int | None) -> None:
    if previous is not None:
        import mlx.core as mx
        mx.set_wired_limit(previous)


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc on Linux; elsewhere nothing to do).

    A load frees its chunk temporaries into the heap, where glibc keeps them resident; ``malloc_trim`` returns
    them, so the resident memory after a load is the weights and not what reading them needed on the way.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (musl has no malloc_trim)
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
