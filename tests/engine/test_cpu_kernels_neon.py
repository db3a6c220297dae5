"""The arm64 kernels (NEON and dotprod) on this x86 machine: the C cross-check harness built with Debian's aarch64
cross compiler and run under qemu user-mode emulation, every type against the scalar kernels.

Needs the packages in .ci/apt-packages-neon.txt (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user); CI
installs them, and a machine without them fails here rather than skipping.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.backends.cpu import kernels

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "engine/backends/cpu/csrc"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
SHAPES_PER_TYPE = 3 * 8  # the harness's row/column shapes times its token counts


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: install the Debian packages in .ci/apt-packages-neon.txt"
    return path


@pytest.fixture(scope="module")
def arm64_harness(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("arm64") / "crosscheck"
    sources = [REPO / "tests/engine/cpu_kernels_crosscheck.c", CSRC / "matmul.c", CSRC / "pool.c", *CSRC.glob("kernels_*.c")]
    subprocess.run([_tool(CROSS_CC), "-O2", "-static", "-pthread", "-Wall", "-Werror", "-Wno-unused-function",
                    f"-I{CSRC}", *map(str, sources), "-lm", "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe


def _run(exe: Path, cpu: str) -> str:
    proc = subprocess.run([_tool(QEMU), "-L", SYSROOT, "-cpu", cpu, str(exe)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_neon_and_dotprod_kernels_agree_with_scalar_for_every_type(arm64_harness):
    out = _run(arm64_harness, "max")  # an Armv8.2+ CPU: both arm64 ISAs
    cases = SHAPES_PER_TYPE * len(kernels.SUPPORTED_TYPES)
    for isa in ("neon", "dotprod"):
        assert re.search(rf"^{isa}: {cases} cases, 0 mismatches$", out, re.M), out
    assert "2 ISAs checked against scalar, all agree" in out


@pytest.mark.slow
def test_a_cpu_without_dotprod_runs_the_neon_kernels_only(arm64_harness):
    out = _run(arm64_harness, "cortex-a57")  # Armv8.0: no sdot
    assert re.search(r"^neon: \d+ cases, 0 mismatches$", out, re.M), out
    assert "dotprod:" not in out and "1 ISAs checked against scalar, all agree" in out
