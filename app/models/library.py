"""The model library: every GGUF Hearth can run, wherever it lives, and the files Hearth may delete.

Sources, in listing order:

* ``builtin`` — the built-in model (``app.builtin_model``), once it has been assembled from its part packages
  (``hearth models list`` assembles it first; the app does so on first start with a progress bar);
* ``downloaded`` — files the download manager verified into ``data_dir/models/<org>/<repo>/<file>``;
* ``imported`` — files the user added: copied into ``data_dir/imported`` or linked in place, recorded in
  ``data_dir/imported.json``;
* ``external`` — GGUFs found without copying in the Hugging Face hub cache
  (``models--org--name/snapshots/<rev>/…``), LM Studio's models folder (``publisher/repo/file.gguf``) and
  Ollama's model store (``manifests/<registry>/<namespace>/<model>/<tag>`` JSON manifests whose
  ``application/vnd.ollama.image.model`` layer names the GGUF ``blobs/sha256-<digest>``).

Names are unique paths such as ``bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf``,
``imported/my-model.gguf``, ``hf-cache/Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf`` or
``ollama/llama3.2:1b``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import shutil
import time
from pathlib import Path
from typing import Literal

from ..builtin_model import BuiltinModel
from .json_files import DamagedFile, read_json_state, salvage_objects, write_json
from .metadata_cache import MetadataCache, ModelFileInfo, read_model_info

Source = Literal["builtin", "downloaded", "imported", "external"]
DEFAULT_BUILTIN = object()  # the per-user built-in model (BuiltinModel()), looked up when the library is made
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
MAX_SCAN_DEPTH = 4  # publisher/repo/[quant folder/]file.gguf
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a larger file is not one


class LibraryError(Exception):
    """A library operation was refused or failed; the message says why in words a user understands."""


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One model file in the library."""

    name: str
    path: Path
    source: Source
    file_size: int
    info: ModelFileInfo
    owned: bool = False  # Hearth created this file and may delete it
    repo: str | None = None  # "org/name" on the Hugging Face Hub, when known
    origin: str | None = None  # where an external or linked file lives: "Hugging Face cache", "LM Studio", a path

    @property
    def broken(self) -> bool:
        return self.info.error is not None

    @property
    def supported(self) -> bool:
        """The engine's verdict: the file loads on the backend this machine uses."""
        return not self.broken and self.info.runs

    @property
    def problem(self) -> str | None:
        """Why the model cannot be used, in one line ("Won't load: …"), or None."""
        if self.info.error:
            return f"Won't load: {self.info.error}"
        if not self.info.runs:
            return "Won't load: " + (self.info.reasons[0] if self.info.reasons else "the engine cannot run it")
        return None

    def to_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "source": self.source, "file_size": self.file_size,
                "owned": self.owned, "repo": self.repo, "origin": self.origin, "broken": self.broken,
                "supported": self.supported, **dataclasses.asdict(self.info)}


@dataclasses.dataclass(frozen=True)
class RemovalPlan:
    """What removing an entry does: ``delete`` lists the files that go, ``message`` says it in words."""

    entry: ModelEntry
    delete: tuple[Path, ...]
    message: str


def default_scan_dirs() -> list[Path]:
    """The Hugging Face hub cache, LM Studio's models folders (current and older location) and Ollama's store."""
    from huggingface_hub import constants

    home = Path.home()
    return [Path(constants.HF_HUB_CACHE), home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models",
            *ollama_model_dirs()]


def ollama_model_dirs() -> list[Path]:
    """Where Ollama keeps models: ``OLLAMA_MODELS`` when set, else ``~/.ollama/models`` (macOS, Windows, Linux
    user installs) and, on Linux, the system service's ``/usr/share/ollama/.ollama/models``."""
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    dirs = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):
        dirs.append(Path("/usr/share/ollama/.ollama/models"))
    return dirs


class ModelLibrary:
    """Lists, imports and removes models. All state lives under ``data_dir``; nothing is global."""

    def __init__(self, data_dir: Path, scan_dirs: list[Path] | None = None,
                 builtin: BuiltinModel | None = DEFAULT_BUILTIN):  # type: ignore[assignment]
        self.data_dir = Path(data_dir)
        self.models_dir = self.data_dir / "models"
        self.imported_dir = self.data_dir / "imported"
        self.scan_dirs = default_scan_dirs() if scan_dirs is None else [Path(d) for d in scan_dirs]
        self.builtin = BuiltinModel() if builtin is DEFAULT_BUILTIN else builtin  # None: list no built-in model
        self._registry_path = self.data_dir / "imported.json"
        self._cache = MetadataCache(self.data_dir / "model-metadata-cache.json")
        self.notices: list[str] = []  # for the user: a damaged registry found, where it went, what was kept

    # -- listing ---------------------------------------------------------------------------------------
    def list(self) -> list[ModelEntry]:
        """Every model from every source; broken files are listed with their error, never raised."""
        found = self._builtin() + self._downloaded() + self._imported() + self._external()
        present = [f.path for f in found if f.error is None]
        infos = self._cache.lookup(present, prune=True)
        entries, taken = [], set()
        for f in found:
            info = infos.get(f.path) or ModelFileInfo(error=f.error)
            entries.append(f.entry(_unique(f.name, taken), info))
        return entries

    def get(self, name: str) -> ModelEntry:
        for entry in self.list():
            if entry.name == name:
                return entry
        raise LibraryError(f"there is no model named {name!r} in the library (see 'hearth models list')")

    def _builtin(self) -> list[_Found]:
        if self.builtin is None or not self.builtin.is_ready():
            return []
        origin = "bundled with Hearth" if self.builtin.bundled else f"assembled in {self.builtin.directory}"
        return [_Found(f"builtin/{self.builtin.path.name}", self.builtin.path, "builtin", origin=origin)]

    def _downloaded(self) -> list[_Found]:
        found = []
        for path in _gguf_files(self.models_dir, depth=8):
            rel = path.relative_to(self.models_dir)
            repo = "/".join(rel.parts[:2]) if len(rel.parts) > 2 else None
            found.append(_Found(rel.as_posix(), path, "downloaded", owned=True, repo=repo))
        return found

    def _imported(self) -> list[_Found]:
        found, seen = [], set()
        for record in self._registry():
            path = Path(record["path"])
            seen.add(path)
            linked = record["mode"] == "link"
            found.append(_Found(f"imported/{path.name}", path, "imported", owned=not linked,
                                origin=str(path) if linked else record.get("original")))
        for path in _gguf_files(self.imported_dir, depth=1):  # a copy whose registry write was interrupted
            if path not in seen:
                found.append(_Found(f"imported/{path.name}", path, "imported", owned=True))
        return found

    def _external(self) -> list[_Found]:
        found, seen = [], set()
        for root in self.scan_dirs:
            if not root.is_dir():
                continue
            if _is_ollama_store(root):
                scan = _scan_ollama(root)
            else:
                scan = _scan_hf_cache(root) if _is_hf_cache(root) else _scan_folder(root)
            for f in scan:
                key = _real(f.path)
                if key not in seen:
                    seen.add(key)
                    found.append(f)
        return found

    # -- import and removal ----------------------------------------------------------------------------
    def import_file(self, path: Path, mode: Literal["copy", "link"] = "copy",
                    keep_unrunnable: bool = False) -> ModelEntry:
        """Add a GGUF from anywhere: ``copy`` it into Hearth's data folder, or ``link`` to it where it is.

        The file is validated first: a malformed file is refused, and so is one the engine cannot run
        (the verdict's first reason says why) unless ``keep_unrunnable``, which lists it with that reason.
        """
        if mode not in ("copy", "link"):
            raise LibraryError(f"import mode must be 'copy' or 'link', not {mode!r}")
        source = Path(path).expanduser().resolve()
        if not source.is_file():
            raise LibraryError(f"{source} is not a file")
        info = read_model_info(source)
        if info.error:
            raise LibraryError(f"{source} is not a usable GGUF model: {info.error}")
        if not info.runs and not keep_unrunnable:
            raise LibraryError(f"{source.name} won't load: " + "; ".join(info.reasons))
        name = f"imported/{source.name}"
        if any(e.name == name for e in self.list()):
            raise LibraryError(f"a model named {name!r} is already in the library; rename the file or remove that one first")
        target = source if mode == "link" else self._copy_in(source)
        records = self._registry() + [{"path": str(target), "mode": mode, "original": str(source),
                                       "imported_at": time.time()}]
        write_json(self._registry_path, records)
        return self.get(name)

    def _copy_in(self, source: Path) -> Path:
        self.imported_dir.mkdir(parents=True, exist_ok=True)
        target = self.imported_dir / source.name
        partial = self.imported_dir / f".{source.name}.importing"
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise LibraryError(f"could not copy {source} into {self.imported_dir}: {e.strerror or e}") from None
        return target

    def plan_removal(self, name: str) -> RemovalPlan:
        """What ``remove(name)`` would do, for the caller to confirm; raises LibraryError when refused."""
        entry = self.get(name)
        if entry.source == "builtin":
            raise LibraryError(f"{name} ships with Hearth ({entry.origin}) and cannot be removed")
        if entry.source == "external":
            raise LibraryError(f"{name} belongs to {entry.origin} ({entry.path}); Hearth only deletes files it "
                               "created — delete it there or by hand")
        if not entry.owned:
            return RemovalPlan(entry, (), f"forget {name}; the file at {entry.path} stays where it is")
        size = entry.file_size / 1e9
        return RemovalPlan(entry, (entry.path,), f"delete {entry.path} ({size:.2f} GB)")

    def remove(self, name: str) -> RemovalPlan:
        """Remove an entry the caller has confirmed: delete the file if Hearth owns it, else only forget it."""
        plan = self.plan_removal(name)
        for path in plan.delete:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise LibraryError(f"could not delete {path}: {e.strerror or e}") from None
            if plan.entry.source == "downloaded":
                _prune_empty_dirs(path.parent, self.models_dir)
        if plan.entry.source == "imported":
            write_json(self._registry_path, [r for r in self._registry() if Path(r["path"]) != plan.entry.path])
        return plan

    def check_registry(self) -> list[str]:
        """Read the registry of imported models once (at start-up); the notices about a damaged one."""
        self._registry()
        return self.notices

    def _registry(self) -> list[dict]:
        try:
            records = read_json_state(self._registry_path, [])
        except DamagedFile as e:  # keep every record still readable; the damaged file stays beside it
            records = [r for r in salvage_objects(e.moved_to.read_bytes().decode("utf-8", "replace")) if _is_record(r)]
            write_json(self._registry_path, records)
            self.notices.append(f"The list of imported models was damaged; it was moved to {e.moved_to}. "
                                f"{len(records)} imported model(s) could still be read from it and were kept.")
        return [r for r in records if _is_record(r)] if isinstance(records, list) else []


def _is_record(r: object) -> bool:
    return isinstance(r, dict) and isinstance(r.get("path"), str) and r.get("mode") in ("copy", "link")


@dataclasses.dataclass
class _Found:
    """A candidate file before its metadata is looked up; ``error`` set when it cannot even be read."""

    name: str
    path: Path
    source: Source
    owned: bool = False
    repo: str | None = None
    origin: str | None = None
    error: str | None = None

    def __post_init__(self):
        if self.error is None:
            self.error = _file_problem(self.path)

    def entry(self, name: str, info: ModelFileInfo) -> ModelEntry:
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        return ModelEntry(name, self.path, self.source, size, info, self.owned, self.repo, self.origin)


def _file_problem(path: Path) -> str | None:
    if not path.exists():
        return f"the file is missing: {path}" + (" (broken link)" if path.is_symlink() else "")
    match = SPLIT_PART.search(path.name)
    if match:
        return f"the model is split into {int(match.group(2))} files; Hearth cannot load split GGUF models yet"
    return None


def _gguf_files(root: Path, depth: int) -> list[Path]:
    """``*.gguf`` files under ``root`` down to ``depth`` levels, sorted; later parts of split models skipped."""
    if not root.is_dir():
        return []
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        level = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if level + 1 < depth else []
        for name in sorted(filenames):
            match = SPLIT_PART.search(name)
            if name.lower().endswith(".gguf") and not name.startswith(".") and not (match and int(match.group(1)) > 1):
                out.append(Path(dirpath) / name)
    return out


def _is_hf_cache(root: Path) -> bool:
    return any(p.name.startswith("models--") for p in root.iterdir())


def _scan_hf_cache(root: Path) -> list[_Found]:
    """GGUFs in ``models--org--name/snapshots/<rev>/``; the revision ``refs/main`` names wins over older ones."""
    found = []
    for repo_dir in sorted(root.glob("models--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        snapshots = repo_dir / "snapshots"
        if not snapshots.is_dir():
            continue
        main = (repo_dir / "refs" / "main").read_text().strip() if (repo_dir / "refs" / "main").is_file() else None
        revisions = sorted(snapshots.iterdir(), key=lambda d: (d.name != main, -d.stat().st_mtime))
        seen = set()
        for rev in revisions:
            for path in _gguf_files(rev, depth=MAX_SCAN_DEPTH):
                rel = path.relative_to(rev).as_posix()
                if rel not in seen:
                    seen.add(rel)
                    found.append(_Found(f"hf-cache/{repo}/{rel}", path, "external", repo=repo,
                                        origin="the Hugging Face cache"))
    return found


def _scan_folder(root: Path) -> list[_Found]:
    """LM Studio's ``publisher/repo/file.gguf`` layout, or any folder of GGUFs."""
    lmstudio = any(part in (".lmstudio", "lm-studio") for part in root.parts)
    label, origin = ("lmstudio", "LM Studio") if lmstudio else (root.name, str(root))
    found = []
    for path in _gguf_files(root, depth=MAX_SCAN_DEPTH):
        rel = path.relative_to(root)
        repo = "/".join(rel.parts[:2]) if len(rel.parts) > 2 else None
        found.append(_Found(f"{label}/{rel.as_posix()}", path, "external", repo=repo, origin=origin))
    return found


def _is_ollama_store(root: Path) -> bool:
    return (root / "manifests").is_dir() and (root / "blobs").is_dir()


def _scan_ollama(root: Path) -> list[_Found]:
    """Ollama's models: each manifest (``<registry>/<namespace>/<model>/<tag>``) names its GGUF blob."""
    found = []
    manifests = root / "manifests"
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames.sort()
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            parts = path.relative_to(manifests).parts
            digest = _ollama_model_digest(path) if len(parts) == 4 else None
            if digest is not None:
                found.append(_Found(_ollama_name(*parts), root / "blobs" / f"sha256-{digest}", "external",
                                    origin="Ollama"))
    return found


def _ollama_model_digest(manifest: Path) -> str | None:
    """The hex sha256 of the manifest's model layer, or None when the file is not a manifest with one."""
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
    except (OSError, ValueError, AttributeError):
        return None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            match = OLLAMA_DIGEST.fullmatch(str(layer.get("digest", "")))  # never a path out of blobs/
            return match.group(1) if match else None
    return None


def _ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """``ollama/llama3.2:1b`` as Ollama itself names it; other namespaces and registries are spelled out."""
    prefix = [] if registry == OLLAMA_REGISTRY else [registry]
    prefix += [] if registry == OLLAMA_REGISTRY and namespace == "library" else [namespace]
    return "ollama/" + "/".join([*prefix, f"{model}:{tag}"])


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}~{n}", n + 1
    taken.add(candidate)
    return candidate


def _prune_empty_dirs(directory: Path, stop: Path) -> None:
    while directory != stop and stop in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
