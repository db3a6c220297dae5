"""Measure the RSS a simulated model load adds, next to ``estimate_memory``'s figure.

The simulated load maps the GGUF with ``read_gguf``, touches every page of every tensor, allocates a
float32 KV cache of the estimated size and the scratch arrays a head-by-head backend would hold for one
micro-batch (each with its own shape, written), in a fresh interpreter so nothing else is counted. Run
``python -m tests.app.models.measure_memory`` to print the table; the tests assert the 15 % bar.
This is a stand-in until the CPU backend exists: re-validate against its real load.
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
import numpy as np, psutil
from engine.gguf_file import read_gguf
from engine.config import ModelConfig
from engine.memory_estimate import MICRO_BATCH, estimate_memory
path, n_ctx = sys.argv[1], int(sys.argv[2])
proc = psutil.Process()
before = proc.memory_info().rss
g = read_gguf(path)
checksum = 0
for name in g.tensors:
    flat = g.raw(name).reshape(-1)
    checksum += int(flat[::4096].sum()) + int(flat[-1])  # one byte per page makes every page resident
est = estimate_memory(g, n_ctx)
kv = np.empty(est.kv_cache_bytes // 4, np.float32)
kv.fill(0.0)  # a cache at full context has been written everywhere
c, n_batch = ModelConfig.from_gguf(g), min(n_ctx, MICRO_BATCH)
widths = [c.n_embd] * 3 + [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.v_head_dim,
                           c.n_heads * c.v_head_dim] + [c.n_ff] * 3 + [n_ctx]  # last: one head's scores
scratch = [np.ones((n_batch, w), np.float32) for w in widths] + [np.ones(c.n_vocab, np.float32)]
after = proc.memory_info().rss
print(json.dumps({"measured": after - before, "weights": est.weights_bytes, "kv": est.kv_cache_bytes,
                  "overhead": est.overhead_bytes, "total": est.total_bytes, "checksum": checksum}))
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
