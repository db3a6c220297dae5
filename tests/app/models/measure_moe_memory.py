"""Measure the RSS a mixture-of-experts model adds over a 512-token chat on the CPU backend, next to the estimate.

In a fresh interpreter: load the model (its experts memory-mapped), chat until the conversation holds
``n_tokens`` tokens (a long user message, then a greedy reply), and report the resident-set growth with
``estimate_memory``'s parts for a context of ``n_tokens``. Only pages a token read become resident, so after
a few hundred tokens every expert has been chosen somewhere and all of them are resident.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

_CHILD = r"""
import json, sys
import psutil
import engine.model
from engine.memory_estimate import estimate_memory
from engine.sampling import SamplingParams
path, n_tokens, reply = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proc = psutil.Process()
before = proc.memory_info().rss
model = engine.model.load(path, backend="cpu", n_ctx=n_tokens)
words = "the quick brown fox jumps over the lazy dog while experts route every token".split()
text, i = "", 0
while len(model.chat_ids([{"role": "user", "content": text + words[i % len(words)] + " "}])) + reply <= n_tokens:
    text, i = text + words[i % len(words)] + " ", i + 1
_, events = model.chat([{"role": "user", "content": text}], SamplingParams(temperature=0.0), max_tokens=reply)
for event in events:
    pass
after = proc.memory_info().rss
est = estimate_memory(model.gguf, n_tokens, backend="cpu")
print(json.dumps({"measured": after - before, "weights": est.weights_bytes, "active": est.active_weights_bytes,
                  "kv": est.kv_cache_bytes, "overhead": est.overhead_bytes, "total": est.total_bytes,
                  "tokens": len(model.sequence)}))
"""


def measure_chat(path: Path, n_tokens: int = 512, reply: int = 32) -> dict:
    """RSS growth over a chat of about ``n_tokens`` tokens (``reply`` of them generated), with the estimate's
    parts for a context of ``n_tokens``, in bytes."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(n_tokens), str(reply)], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
