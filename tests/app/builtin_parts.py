"""Small fake part distributions of a built-in model, installed into a temporary site directory."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

from app.builtin_model import BuiltinSpec


def install_fake_parts(site: Path, chunks: list[bytes], prefix: str = "hearth-fake-part") -> BuiltinSpec:
    """Write one distribution per chunk (``<prefix>1`` …, each with a data file and a module) into ``site``.

    The caller puts ``site`` on ``sys.path`` (``monkeypatch.syspath_prepend``). Returns the spec of the model the
    chunks make up in order.
    """
    names = []
    for i, chunk in enumerate(chunks, start=1):
        name = f"{prefix}{i}"
        package = name.replace("-", "_")
        (site / package / "data").mkdir(parents=True)
        (site / package / "__init__.py").write_text("raise ImportError('data only: never imported')\n")
        (site / package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        info = site / f"{package}-0.9.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.9.0\n")
        (info / "RECORD").write_text(f"{package}/__init__.py,,\n{package}/data/part{i:02d}.bin,,\n"
                                     f"{package}-0.9.0.dist-info/METADATA,,\n{package}-0.9.0.dist-info/RECORD,,\n")
        names.append(name)
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    return BuiltinSpec(name="Fake Model", file_name="fake.gguf", sha256=hashlib.sha256(whole).hexdigest(),
                       size=len(whole), parts=tuple(names), parts_version="0.9.0")
