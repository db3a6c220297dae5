"""The installed ``llama_cpp`` (llama-cpp-python), the peer of the parity tests, made safe to run on this machine.

pip builds llama-cpp-python from its sdist with ``-march=native``. On a Xeon with AMX that turns on llama.cpp's AMX
kernels, and in this version they die with SIGILL at their first tile instruction (every prefill of a Q4_0, Q4_K,
Q6_K or Q8_0 model: upstream llama.cpp PR #26954), taking the test process with them. So where the installed
library reports ``AMX_INT8 = 1``, it is rebuilt once from the same sdist with AMX turned off (its AVX-512 kernels
stay) — the same flags ``tests/llama_cpp_tools.py`` builds llama.cpp's own tools with.

``python -m tests.llama_cpp_peer`` checks, rebuilds if needed (ten minutes on two cores beside the tools' build) and prints the
library's feature line. The root ``conftest.py`` runs the same check before a test session imports ``llama_cpp``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.llama_cpp_sources import NO_AMX_FLAGS, PACKAGE, version

PROBE = "import llama_cpp, sys; sys.stdout.write(llama_cpp.llama_print_system_info().decode())"


def system_info() -> str:
    """The installed library's feature line, read in a child process (this process never loads it)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"importing llama_cpp failed ({done.returncode}): {done.stderr.strip()[-1000:]}")
    return done.stdout


def has_amx(info: str) -> bool:
    return "AMX_INT8 = 1" in info


def rebuild_without_amx() -> None:
    """Reinstall this version of llama-cpp-python from its sdist, compiled without AMX (no cached wheel reused)."""
    env = dict(os.environ)
    for var in ("CFLAGS", "CXXFLAGS"):
        env[var] = f"{env.get(var, '')} {NO_AMX_FLAGS}".strip()
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", "--no-cache-dir",
           "--no-binary", PACKAGE, f"{PACKAGE}=={version()}"]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"rebuilding {PACKAGE} without AMX failed ({done.returncode}):\n{done.stdout[-4000:]}")


def ensure_safe() -> str:
    """The library's feature line after rebuilding it without AMX where it had AMX kernels."""
    info = system_info()
    if has_amx(info):
        print(f"{PACKAGE} {version()} was built with llama.cpp's AMX kernels, which die with SIGILL here; "
              "rebuilding it without them (once, a few minutes)…", file=sys.stderr, flush=True)
        rebuild_without_amx()
        info = system_info()
        if has_amx(info):
            raise RuntimeError(f"{PACKAGE} still reports AMX_INT8 = 1 after a rebuild with {NO_AMX_FLAGS}")
    return info


def main() -> int:
    print(ensure_safe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
