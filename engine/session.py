"""Session snapshots: a conversation plus the engine state (tokens, every layer's KV cache or, in a hybrid
model's recurrent layers, its conv and delta-rule states, sampler state).

The container is safetensors (a JSON header and raw arrays; nothing in it can execute). The header holds the
format version, the model's fingerprint (GGUF sha256), backend, context length and KV dtype, and a sha256
of the payload, so a snapshot from another model, a truncated or tampered file, or one with the wrong shapes
is refused with a clear reason before anything is restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from .atomic_write import atomic_write
from .backends.base import KVState

FORMAT = "hearth-session"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 20


class SessionError(ValueError):
    """The snapshot cannot be restored; the message says why."""


@dataclasses.dataclass(frozen=True)
class Session:
    """What a snapshot holds besides the KV arrays."""

    tokens: list[int]  # the whole sequence: prompt and generated tokens
    kv: KVState  # keys/values of tokens[:kv.n_past]
    model_sha256: str
    model_name: str
    backend: str
    n_ctx: int
    conversation: Any = None  # the app's messages and settings, JSON-serialisable
    sampler_state: dict | None = None


def save_session(path: str | os.PathLike, session: Session) -> None:
    """Write ``session`` atomically (temp file, fsync, rename): a crash leaves the previous file intact."""
    arrays = {"tokens": np.asarray(session.tokens, dtype=np.int32)}
    for i, (k, v) in enumerate(zip(session.kv.keys, session.kv.values)):
        arrays[f"k.{i:04d}"] = np.ascontiguousarray(k, dtype=np.float32)
        arrays[f"v.{i:04d}"] = np.ascontiguousarray(v, dtype=np.float32)
    for j, state in enumerate(session.kv.recurrent or ()):  # hybrid models: conv and delta-rule states
        arrays[f"r.{j:04d}"] = np.ascontiguousarray(state, dtype=np.float32)
    header = {
        "format": FORMAT, "version": str(FORMAT_VERSION), "model_sha256": session.model_sha256,
        "model_name": session.model_name, "backend": session.backend, "n_ctx": str(session.n_ctx),
        "kv_dtype": "float32", "n_past": str(session.kv.n_past), "n_layers": str(len(session.kv.keys)),
        "n_recurrent": str(len(session.kv.recurrent or ())),
        "conversation": json.dumps(session.conversation, ensure_ascii=False),
        "sampler_state": json.dumps(session.sampler_state),
    }
    header["payload_sha256"] = _payload_digest(arrays, header)
    with atomic_write(path) as f:
        f.write(st_save(arrays, metadata=header))


def read_header(path: str | os.PathLike) -> dict[str, str]:
    """The snapshot's header alone (cheap), validated for format and version."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SessionError("not a Hearth session file (too short)")
        n = int.from_bytes(prefix, "little")
        if n > MAX_HEADER_BYTES:
            raise SessionError("not a Hearth session file (no valid header)")
        raw = f.read(n)
    try:
        header = json.loads(raw).get("__metadata__") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise SessionError("not a Hearth session file (no valid header)") from None
    if header.get("format") != FORMAT:
        raise SessionError("not a Hearth session file")
    version = header.get("version", "")
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise SessionError(f"the session was written by a newer Hearth (format version {version}); update Hearth to open it")
    return header


def check_file(path: str | os.PathLike) -> dict[str, str]:
    """Cheap whole-file check (no payload read): a valid header and exactly the bytes its arrays need.

    Returns:
        The header, as ``read_header``.

    Raises:
        SessionError: a garbled header or a file shorter or longer than its arrays (a truncated write).
    """
    header = read_header(path)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        table = json.loads(f.read(n))
    try:
        end = max((int(t["data_offsets"][1]) for k, t in table.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError) as e:
        raise SessionError(f"the session's array table is damaged ({e!r})") from None
    size = os.path.getsize(path)
    if size != 8 + n + end:
        raise SessionError(f"the session file is truncated or damaged ({size} bytes, its arrays need {8 + n + end})")
    return header


def read_conversation(path: str | os.PathLike) -> Any:
    """The conversation stored in a snapshot, for a text-only import when the engine state cannot be used."""
    try:
        return json.loads(read_header(path)["conversation"])
    except (KeyError, ValueError) as e:
        raise SessionError(f"the session's conversation cannot be read ({e})") from None


def load_session(path: str | os.PathLike, model_sha256: str, n_layers: int, kv_shape: tuple[int, int, int],
                 recurrent_layers: Sequence[int] = (), recurrent_shapes: Sequence[tuple[int, ...]] = ()) -> Session:
    """Read and verify a snapshot for a model.

    Args:
        path: the snapshot file.
        model_sha256: the loaded model's GGUF sha256; a snapshot of another model is refused.
        n_layers: the loaded model's layer count.
        kv_shape: (n_kv_heads, head_dim, v_head_dim) of the loaded model.
        recurrent_layers: a hybrid model's recurrent layers, which hold no keys and values.
        recurrent_shapes: the shape of each recurrent state array, in ``KVState.recurrent`` order.

    Raises:
        SessionError: with the reason the snapshot cannot be restored.
    """
    header = read_header(path)
    if header.get("model_sha256") != model_sha256:
        raise SessionError(f"the session belongs to another model ({header.get('model_name', '?')}, "
                           f"sha256 {header.get('model_sha256', '?')[:12]}…)")
    try:
        with open(path, "rb") as f:
            arrays = st_load(f.read())
    except (SafetensorError, ValueError, OSError) as e:
        raise SessionError(f"the session file is damaged or truncated ({e})") from None
    if _payload_digest(arrays, header) != header.get("payload_sha256"):
        raise SessionError("the session file is corrupt (checksum mismatch)")
    kv = _kv_state(arrays, header, n_layers, kv_shape, recurrent_layers, recurrent_shapes)
    tokens = arrays["tokens"].astype(np.int64).tolist() if "tokens" in arrays else []
    if len(tokens) < kv.n_past:
        raise SessionError("the session holds fewer tokens than KV positions")
    try:
        conversation, sampler = json.loads(header["conversation"]), json.loads(header["sampler_state"])
        n_ctx = int(header["n_ctx"])
    except (KeyError, ValueError) as e:
        raise SessionError(f"the session header is incomplete ({e})") from None
    return Session(tokens, kv, model_sha256, header.get("model_name", ""), header.get("backend", ""), n_ctx,
                   conversation, sampler)


def _kv_state(arrays: dict[str, np.ndarray], header: dict[str, str], n_layers: int,
              kv_shape: tuple[int, int, int], recurrent_layers: Sequence[int] = (),
              recurrent_shapes: Sequence[tuple[int, ...]] = ()) -> KVState:
    n_kv_heads, head_dim, v_head_dim = kv_shape
    n_past = int(header.get("n_past", "-1")) if header.get("n_past", "").isdigit() else -1
    if header.get("n_layers") != str(n_layers) or n_past < 0:
        raise SessionError(f"the session has {header.get('n_layers')} layers, the model {n_layers}")
    keys, values = [], []
    for i in range(n_layers):
        k, v = arrays.get(f"k.{i:04d}"), arrays.get(f"v.{i:04d}")
        held = 0 if i in recurrent_layers else n_past
        if k is None or v is None or k.shape != (n_kv_heads, held, head_dim) or v.shape != (n_kv_heads, held, v_head_dim):
            raise SessionError(f"the session's KV arrays of layer {i} have the wrong shape for this model")
        keys.append(k)
        values.append(v)
    if header.get("n_recurrent", "0") != str(len(recurrent_shapes)):
        raise SessionError(f"the session holds {header.get('n_recurrent', '0')} recurrent state arrays, "
                           f"the model {len(recurrent_shapes)}")
    recurrent = [arrays.get(f"r.{j:04d}") for j in range(len(recurrent_shapes))]
    for j, (state, shape) in enumerate(zip(recurrent, recurrent_shapes)):
        if state is None or state.shape != tuple(shape):
            raise SessionError(f"the session's recurrent state array {j} has the wrong shape for this model")
    return KVState(keys, values, n_past, recurrent or None)


def _payload_digest(arrays: dict[str, np.ndarray], header: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for key in sorted(k for k in header if k != "payload_sha256"):
        digest.update(f"{key}={header[key]}\n".encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{a.dtype.str}:{a.shape}\n".encode())
        if a.size:  # a recurrent layer's keys hold no positions; memoryview cannot cast an empty array
            digest.update(memoryview(a).cast("B"))
    return digest.hexdigest()
