"""llama.cpp's sources from the ``llama-cpp-python`` sdist on PyPI, fetched once and cached outside the repo.

The sdist carries the llama.cpp tree the installed ``llama_cpp`` was built from: its tokenizer test vocabularies
(``models/ggml-vocab-*.gguf`` with ``.inp``/``.out`` cases), real chat templates (``models/templates/*.jinja``)
and the sources of its own tools (``llama-server``, ``llama-bench``, ``llama-quantize``), which tests and benches
build with cmake. ``python -m tests.llama_cpp_sources`` fetches it and prints the tree's path.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from tests.model_store import cache_dir

PACKAGE = "llama-cpp-python"
# Compiler flags for every build of this tree: GCC keeps an explicit -mno-* over what -march=native turns on, so
# ggml sees no __AMX_INT8__. This version's AMX kernels die with SIGILL at their first tile instruction on a Xeon
# with AMX (upstream llama.cpp PR #26954); without them llama.cpp runs its AVX-512 kernels.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def version() -> str:
    """The installed llama-cpp-python's version: the sources must be the ones its library was built from."""
    return metadata.version(PACKAGE)


def llama_cpp_tree() -> Path:
    """The llama.cpp source tree (``vendor/llama.cpp`` of the sdist), downloaded and unpacked on first use."""
    root = cache_dir() / f"llama-cpp-python-{version()}"
    tree = root / "vendor" / "llama.cpp"
    done = root / ".unpacked"
    if done.exists():
        return tree
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                        "-d", tmp, f"{PACKAGE}=={version()}"], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")  # "data": no links out of the tree, no device files
        (unpacked,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if root.exists():
            import shutil
            shutil.rmtree(root)
        unpacked.rename(root)
    done.write_text(version())
    return tree


def vocab_file(name: str) -> Path:
    """llama.cpp's test vocabulary ``models/ggml-vocab-NAME.gguf`` (e.g. ``qwen2``, ``phi-3``, ``llama-bpe``)."""
    path = llama_cpp_tree() / "models" / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def chat_template(name: str) -> str:
    """A real model's chat template from ``models/templates/NAME.jinja``."""
    return (llama_cpp_tree() / "models" / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def main() -> int:
    print(llama_cpp_tree())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
