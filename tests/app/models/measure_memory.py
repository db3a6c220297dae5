"""Measure the RSS a real CPU-backend load adds at full context, next to ``estimate_memory``'s figure.

In a fresh interpreter (so nothing else is counted): load the model with the CPU backend, touch every weight
page (they are memory-mapped), reserve and write a KV cache of ``n_ctx`` positions, and run one short forward
pass so the decoder's scratch arena exists. Run ``python -m tests.app.models.measure_memory`` to print the table;
the tests assert the 15 % bar.
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
import psutil
import engine.model
from engine.memory_estimate import estimate_memory
path, n_ctx = sys.argv[1], int(sys.argv[2])
proc = psutil.Process()
before = proc.memory_info().rss
model = engine.model.load(path, backend="cpu", n_ctx=n_ctx)
g = model.gguf
checksum = 0
for name in g.tensors:
    flat = g.raw(name).reshape(-1)
    checksum += int(flat[::4096].sum()) + int(flat[-1])  # one byte per page makes every page resident
full = model.backend.new_cache(n_ctx)
full.reserve(n_ctx)
full.k.fill(0)  # a cache at full context has been written everywhere
full.v.fill(0)
model.backend.forward(model.tokenize("The memory of a model at full context."), model.backend.new_cache(64))
after = proc.memory_info().rss
est = estimate_memory(g, n_ctx, backend="cpu")
print(json.dumps({"measured": after - before, "weights": est.weights_bytes, "kv": est.kv_cache_bytes,
                  "kv_measured": full.nbytes, "overhead": est.overhead_bytes, "total": est.total_bytes,
                  "checksum": checksum}))
"""


def measure(path: Path, n_ctx: int) -> dict:
    """RSS growth of the simulated load of ``path`` at ``n_ctx``, with the estimate's parts, in bytes."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(n_ctx)], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    from tests.model_store import model_path

    print(f"{'model':<12} {'n_ctx':>6} {'weights':>9} {'kv':>9} {'overhead':>9} {'estimate':>9} {'measured':>9} {'error':>7}")
    for name in ("smollm2", "gemma3", "qwen25coder"):
        for n_ctx in (512, 4096, 32768):
            r = measure(model_path(name), n_ctx)
            mib = {k: r[k] / 2**20 for k in ("weights", "kv", "overhead", "total", "measured")}
            error = (r["total"] - r["measured"]) / r["measured"]
            print(f"{name:<12} {n_ctx:>6} {mib['weights']:>8.1f}M {mib['kv']:>8.1f}M {mib['overhead']:>8.1f}M "
                  f"{mib['total']:>8.1f}M {mib['measured']:>8.1f}M {error:>+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
