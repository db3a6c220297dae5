"""llama.cpp's own tools (``llama-server``, ``llama-bench``, ``llama-quantize``), built once with cmake and cached.

They are built from the llama.cpp tree inside the ``llama-cpp-python`` sdist (``tests/llama_cpp_sources.py``), the
same version the installed ``llama_cpp`` library was built from, into the test-model cache outside the repo. Tests
use ``llama-server`` as a peer (the API server's load test, remote engines); benches use ``llama-bench``. The build
needs only cmake and a C++ compiler: no network (the server's web UI is left out), no curl, no OpenSSL.

``python -m tests.llama_cpp_tools`` builds them (CI does this once) and prints the directory of the binaries.
Concurrent callers wait on a lock file instead of building twice.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.llama_cpp_sources import NO_AMX_FLAGS, llama_cpp_tree, version
from tests.model_store import cache_dir

TOOLS = ("llama-server", "llama-bench", "llama-quantize")

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",          # self-contained binaries: nothing to find at run time
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",      # the web UI would be downloaded from Hugging Face: not needed, no network
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DGGML_NATIVE=ON",                 # the peer gets this machine's best kernels, as a user's own build would
    f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}",   # ... but AMX, whose kernels die with SIGILL here (llama_cpp_sources)
    f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}",
)
OPTIONS_STAMP = ".cmake-options"  # beside the binaries: the options they were built with; others mean rebuild
OPTIONS_TEXT = "\n".join(CMAKE_OPTIONS)


def tools_dir() -> Path:
    """Where the built binaries live: ``<cache>/llama-cpp-tools-<version>/bin``."""
    return cache_dir() / f"llama-cpp-tools-{version()}" / "bin"


def tool_path(name: str) -> Path:
    """The path of one built tool, building all of them first if needed."""
    if name not in TOOLS:
        raise ValueError(f"unknown llama.cpp tool {name!r}; known: {', '.join(TOOLS)}")
    path = tools_dir() / name
    if not _built(tools_dir()):
        build()
    return path


def _built(out: Path) -> bool:
    """Whether every tool is in ``out``, built with today's ``CMAKE_OPTIONS``."""
    stamp = out / OPTIONS_STAMP
    return all((out / t).exists() for t in TOOLS) and stamp.exists() and stamp.read_text() == OPTIONS_TEXT


def build(jobs: int | None = None) -> Path:
    """Configure and build the tools (once; a lock keeps concurrent callers from building twice)."""
    out = tools_dir()
    root = out.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _built(out):
            return out
        src = llama_cpp_tree()
        build_dir = root / "build"
        shutil.rmtree(build_dir, ignore_errors=True)  # a stale configure would keep its old flags
        jobs = jobs or os.cpu_count() or 2
        _run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_OPTIONS])
        _run(["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", *TOOLS])
        staging = root / "bin.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for tool in TOOLS:
            shutil.copy2(build_dir / "bin" / tool, staging / tool)
        (staging / OPTIONS_STAMP).write_text(OPTIONS_TEXT)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        shutil.rmtree(build_dir, ignore_errors=True)   # ~1 GB of objects; the binaries are all we keep
    return out


def _run(cmd: list[str]) -> None:
    """Run one build step quietly; on failure raise with the tail of its output (the compiler's warnings are noise)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} … failed ({done.returncode}):\n{done.stdout[-4000:]}")


def main() -> int:
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
