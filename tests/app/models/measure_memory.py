"""Measure the RSS a real load (CPU or NumPy backend) adds at full context, beside ``estimate_memory``'s figure.

In a fresh interpreter (so nothing else is counted): load the model on a backend, touch every page of the file
(memory-mapped) that the backend still reads from the map, reserve and write a KV cache of ``n_ctx`` positions,
and run the last prompt chunk that fills the context, so the scratch exists at its largest. ``peak`` is the growth
of the process's peak RSS (the NumPy backend's attention scores are freed before the end). Run
``python -m tests.app.models.measure_memory [cpu|numpy]`` to print the table; the tests assert the 8 % bar.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PAGE = 4096

_CHILD = r"""
import json, sys
import numpy as np
import psutil
import engine.model
from engine.gguf_file import touch_tensors
from engine.memory_estimate import estimate_memory
path, n_ctx, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
proc = psutil.Process()
before = proc.memory_info().rss
model = engine.model.load(path, backend=backend, n_ctx=n_ctx)
g = model.gguf
# cpu computes on the memory-mapped file, less the matrices it repacked (their copies are resident, their mapped
# pages released); numpy read all of it to dequantize. Touching every page the backend still reads from the map
# (as a load's own measurement does) makes the figure not depend on whether the system reclaimed some of those
# clean pages meanwhile (under memory pressure)
checksum = touch_tensors(g)
full = model.backend.new_cache(n_ctx)
full.reserve(n_ctx)
keys, values = full.layers() if hasattr(full, "layers") else ([full.k], [full.v])
for a in (*keys, *values):
    a[...] = 0  # a cache at full context has been written everywhere
full.advance(n_ctx)
rows = min(n_ctx, int(sys.argv[4]))
full.truncate(n_ctx - rows)  # the last chunk of a prompt that fills the context: attention over every position
token = model.tokenize("The")[-1]
model.backend.forward([token] * rows, full)
after = proc.memory_info().rss
# this process's own high-water mark: ru_maxrss would carry the parent's (pytest's) RSS across fork and exec
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) * 1024
est = estimate_memory(g, n_ctx, backend=model.backend.name)
print(json.dumps({"backend": model.backend.name, "measured": after - before, "peak": peak - before,
                  "weights": est.weights_bytes, "kv": est.kv_cache_bytes, "kv_measured": full.nbytes,
                  "overhead": est.overhead_bytes, "total": est.total_bytes, "checksum": checksum}))
"""


def measure(path: Path, n_ctx: int, backend: str = "cpu") -> dict:
    """RSS growth of a load of ``path`` on ``backend`` at ``n_ctx`` whose last prompt chunk filled the context,
    with the estimate's parts, in bytes; ``peak`` is the growth of the process's peak RSS."""
    from engine.backends.cpu.decoder import MAX_ROWS
    from engine.backends.numpy_backend import PREFILL_CHUNK

    rows = MAX_ROWS if backend == "cpu" else PREFILL_CHUNK
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(n_ctx), backend, str(rows)], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["backend"] == backend, f"asked for {backend}, the load ran {result['backend']}"
    return result


def main() -> int:
    from tests.model_store import model_path

    backend = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    print(f"{'model':<12} {'n_ctx':>6} {'weights':>9} {'kv':>9} {'overhead':>9} {'estimate':>9} {'measured':>9} {'error':>7}"
          f" {'peak':>9}")
    for name in ("smollm2", "gemma3", "qwen25coder"):
        for n_ctx in (512, 4096, 32768):
            r = measure(model_path(name), n_ctx, backend)
            mib = {k: r[k] / 2**20 for k in ("weights", "kv", "overhead", "total", "measured")}
            error = (r["total"] - r["measured"]) / r["measured"]
            print(f"{name:<12} {n_ctx:>6} {mib['weights']:>8.1f}M {mib['kv']:>8.1f}M {mib['overhead']:>8.1f}M "
                  f"{mib['total']:>8.1f}M {mib['measured']:>8.1f}M {error:>+7.1%} {r['peak'] / 2**20:>8.1f}M")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
