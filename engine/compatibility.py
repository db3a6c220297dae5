"""Can Hearth run this GGUF file, and why not: a verdict from the header alone (metadata and tensor table).

The same ``check`` judges a file on disk (``read_gguf``), the first megabytes of a file on the Hub
(``GGUFHeader``) and ``python -m engine inspect``. It never keeps its own list of what is supported: it runs
the engine's own checks (``ModelConfig.from_gguf``, the per-layer tensor names and shapes of
``model_tensors``, the tokenizer's vocabulary) and asks each backend which tensor types it can hold (the C
kernels' ``SUPPORTED_TYPES``, the MLX repacker's ``REPACKS``, the ``gguf`` package's NumPy dequantizer).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Literal

import numpy as np

from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType
from .gguf_file import GGUFFile, ModelFormatError
from .memory_estimate import BACKENDS as ESTIMATED_BACKENDS
from .memory_estimate import MemoryEstimate, estimate_memory

DEFAULT_N_CTX = 4096  # the context the memory estimate assumes unless told (engine.model's default)
BACKEND_NAMES = {"cpu": "CPU kernel", "numpy": "NumPy dequantizer", "mlx": "MLX form"}


@dataclasses.dataclass(frozen=True)
class Compatibility:
    """Whether a model file runs on a backend here, why not (one line per reason), and what it would need."""

    backend: str  # the backend judged: "cpu", "numpy" or "mlx" ("auto" resolved for this machine)
    runs: bool
    reasons: tuple[str, ...]  # empty when it runs
    architecture: str | None
    parameter_count: int
    context_length: int | None  # the training context from the metadata
    tensor_types: dict[str, int]  # type name -> tensor count, most common first
    n_ctx: int  # the context the memory estimates assume
    memory: dict[str, MemoryEstimate]  # per backend whose estimate could be made (needs a valid config)

    @property
    def reason(self) -> str | None:
        """The first reason it does not run, or None."""
        return self.reasons[0] if self.reasons else None

    @property
    def memory_bytes(self) -> int | None:
        """The estimated total for the judged backend, or None when it could not be estimated."""
        estimate = self.memory.get(self.backend)
        return estimate.total_bytes if estimate else None

    def to_dict(self) -> dict:
        return {"backend": self.backend, "runs": self.runs, "reasons": list(self.reasons),
                "architecture": self.architecture, "parameter_count": self.parameter_count,
                "context_length": self.context_length, "tensor_types": self.tensor_types, "n_ctx": self.n_ctx,
                "memory": {name: {"weights_bytes": e.weights_bytes, "kv_cache_bytes": e.kv_cache_bytes,
                                  "overhead_bytes": e.overhead_bytes, "total_bytes": e.total_bytes,
                                  "active_weights_bytes": e.active_weights_bytes, "mapped_bytes": e.mapped_bytes}
                           for name, e in self.memory.items()}}


def check(gguf: GGUFFile, backend: str = "auto", n_ctx: int = DEFAULT_N_CTX,
          estimates: Literal["all", "judged"] = "all") -> Compatibility:
    """Judge whether ``gguf`` loads on ``backend`` here, from its metadata and tensor table only.

    Args:
        gguf: A parsed file (``read_gguf``) or header (``GGUFHeader``); tensor data is never read.
        backend: ``"auto"`` (what ``engine.model.load`` would pick on this machine), ``"cpu"``, ``"numpy"``
            or ``"mlx"``.
        n_ctx: The context length the memory estimates assume.
        estimates: ``"all"`` estimates the memory on every backend whose memory is modelled (MLX's needs the
            mlx package, imported for it); ``"judged"`` only on the judged one.

    Returns:
        The verdict, with every reason found: an unavailable backend, the architecture or a missing or
        misshapen tensor (``ModelConfig.from_gguf``'s and ``model_tensors``' messages), the tokenizer,
        and tensor types the backend cannot hold.

    Raises:
        ValueError: an unknown backend name or a non-positive ``n_ctx``.
    """
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    chosen, reasons = _resolve(backend)
    config, config_reason = _config(gguf)
    reasons += [config_reason] if config_reason else []
    reasons += _tokenizer_reasons(gguf)
    reasons += type_reasons(gguf, chosen)
    arch = gguf.metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    by_type = collections.Counter(t.qtype.name for t in gguf.tensors.values())
    return Compatibility(
        backend=chosen, runs=not reasons, reasons=tuple(reasons), architecture=arch,
        parameter_count=sum(t.n_elements for t in gguf.tensors.values()),
        context_length=_int_metadata(gguf, f"{arch}.context_length") if arch else None,
        tensor_types=dict(by_type.most_common()), n_ctx=n_ctx,
        memory=_estimates(gguf, n_ctx, ESTIMATED_BACKENDS if estimates == "all" else (chosen,))
        if config is not None else {},
    )


def _int_metadata(gguf: GGUFFile, key: str) -> int | None:
    value = gguf.metadata.get(key)
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None


def _resolve(backend: str) -> tuple[str, list[str]]:
    """The backend that would run, and the reason when the one asked for cannot run here."""
    from .backends import BackendUnavailableError, resolve_backend

    try:
        return resolve_backend(backend)[0], []
    except BackendUnavailableError as e:
        return backend, [str(e)]


def _config(gguf: GGUFFile) -> tuple[ModelConfig | None, str | None]:
    """The config and, when the file does not describe a model the decoder runs, the engine's one-line reason."""
    from .model_tensors import layer_tensor_names, output_tensor_name

    try:
        config = ModelConfig.from_gguf(gguf)
    except ModelFormatError as e:
        return None, str(e)
    try:
        for layer in range(config.n_layers):
            layer_tensor_names(gguf, config, layer)
        output_tensor_name(gguf, config)
    except ModelFormatError as e:
        return config, str(e)
    return config, None


def _tokenizer_reasons(gguf: GGUFFile) -> list[str]:
    from .tokenizer import Tokenizer

    try:
        Tokenizer.from_gguf(gguf)
    except ModelFormatError as e:
        return [f"tokenizer: {e}"]
    return []


def type_reasons(gguf: GGUFFile, backend: str) -> list[str]:
    """One line per kind of support missing, naming the tensor types and how many tensors have each.

    Matrices (two or more dimensions) need the backend's own form (``supported_types``); vectors (norms,
    biases) are dequantized by the ``gguf`` package on every backend.
    """
    kinds = ((BACKEND_NAMES[backend], supported_types(backend), lambda info: len(info.shape) >= 2),
             (BACKEND_NAMES["numpy"], numpy_types(), lambda info: len(info.shape) < 2))
    reasons = []
    for what, allowed, applies in kinds:
        missing = collections.Counter(info.qtype.name for info in gguf.tensors.values()
                                      if applies(info) and int(info.qtype) not in allowed)
        if missing:
            listed = ", ".join(f"{name} ({n} tensor{'s' if n > 1 else ''})" for name, n in missing.most_common())
            plural = len(missing) > 1
            reasons.append(f"tensor type{'s' if plural else ''} {listed} {'have' if plural else 'has'} no {what}")
    return reasons


def supported_types(backend: str) -> frozenset[int]:
    """GGML type ids whose matrices ``backend`` computes with, as the backend itself declares them."""
    if backend == "cpu":
        from .backends.cpu.kernels import SUPPORTED_TYPES

        return frozenset(SUPPORTED_TYPES)
    if backend == "mlx":
        from .backends.mlx.repack import DENSE_ITEMSIZE, REPACKS

        return frozenset(int(t) for t in (*DENSE_ITEMSIZE, *REPACKS))
    if backend == "numpy":
        return numpy_types()
    raise ValueError(f"unknown backend {backend!r}")


@functools.cache
def numpy_types() -> frozenset[int]:
    """GGML type ids the ``gguf`` package's NumPy dequantizer handles: asked of it on one zero block each."""
    from gguf.quants import dequantize

    found = set()
    for qtype, (_, type_size) in GGML_QUANT_SIZES.items():
        try:
            dequantize(np.zeros((1, type_size), np.uint8), qtype)
        except (NotImplementedError, ValueError, TypeError, KeyError):
            continue
        found.add(int(qtype))
    return frozenset(found)


def engine_signature(backend: str = "auto") -> str:
    """What a cached verdict depends on: the architectures and the resolved backend's types (changes with them)."""
    chosen, _ = _resolve(backend)
    try:
        types = sorted(GGMLQuantizationType(t).name for t in supported_types(chosen) | numpy_types())
    except ValueError:
        types = []
    return f"{chosen}:{','.join(SUPPORTED_ARCHITECTURES)}:{','.join(types)}"


def _estimates(gguf: GGUFFile, n_ctx: int, backends: tuple[str, ...]) -> dict[str, MemoryEstimate]:
    """The memory estimate on each of ``backends`` that can make one (MLX's needs the mlx package)."""
    out = {}
    for name in backends:
        try:
            out[name] = estimate_memory(gguf, n_ctx, name)
        except (ImportError, ModelFormatError):
            continue
    return out
