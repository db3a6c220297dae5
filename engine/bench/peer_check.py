"""Whether llama.cpp runs on this CPU before the bench loads it into its own process, where a crash would end the
bench with a signal and no word of why.

pip builds llama-cpp-python with ``-march=native``; on an Intel Xeon with AMX that turns on llama.cpp's AMX kernels,
and in the versions Hearth tests against they die with SIGILL at their first tile instruction, on the first prefill
(upstream llama.cpp PR #26954). Where the library reports ``AMX_INT8 = 1``, a child process loads the model and runs
a 32-token prefill first; the same words explain a ``llama-bench`` that dies the same way (``llama_bench.py``).
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

NO_AMX_HINT = ("llama.cpp's AMX kernels die so on some Intel Xeons (llama.cpp PR #26954); build llama.cpp without "
               "them: CFLAGS and CXXFLAGS '-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' (for llama-cpp-python: "
               "pip install --force-reinstall --no-binary llama-cpp-python with those set), see the README")

PROBE = """
import sys, llama_cpp
if "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode():
    llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=32, n_ubatch=32, n_threads=1, verbose=False)
    llm.eval(list(range(1, 33)))
"""
PROBE_TIMEOUT_S = 600


def describe_exit(returncode: int) -> str:
    """A process's return code in words, with the way out where it died of an illegal instruction."""
    if returncode == -signal.SIGILL:
        return f"killed by SIGILL, an illegal instruction: {NO_AMX_HINT}"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


@functools.cache
def check_llama_cpp_runs(path: Path) -> None:
    """Raise unless llama-cpp-python can prefill ``path`` here (checked in a child process, once per file and only
    where the library has AMX kernels; elsewhere the child only imports it).

    Raises:
        RuntimeError: the child failed or was killed, with why and what to do.
    """
    done = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"llama-cpp-python cannot run {Path(path).name} here ({describe_exit(done.returncode)})"
                           f"{': ' + done.stderr.strip()[-500:] if done.stderr.strip() else ''}")
