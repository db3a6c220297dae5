"""The platform checks MLX needs (Apple Silicon, Metal), kept in one small module so tests can fake them."""

from __future__ import annotations

import platform
import sys


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
