"""The CPU backend's C extension as host-side code above the backends reaches it (the sampler's vector arithmetic
in ``vector_math``, the GGUF string tables in ``engine/packed_strings.py``): one place that asks whether it is
built, so no module outside ``engine/backends`` imports the CPU backend's kernel loader itself."""

from __future__ import annotations

from types import ModuleType


def extension() -> ModuleType | None:
    """The loaded C extension, or None where it is not built or switched off (loaded, and the CPU's instruction
    set chosen, on first use; tests switch it off by setting ``backends.cpu.kernels._ext`` to None)."""
    from .cpu import kernels  # noqa: PLC0415 - loaded on first use: it selects the CPU ISA

    return kernels._ext
