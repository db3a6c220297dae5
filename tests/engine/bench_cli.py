"""Runs ``python -m engine bench ...`` in a subprocess, as a user does: tests never import ``engine.bench``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout under test comes first on sys.path


def bench(*args, timeout: float = 900) -> subprocess.CompletedProcess:
    """The finished ``python -m engine bench ARGS`` (stdout and stderr captured as text)."""
    return subprocess.run([sys.executable, "-m", "engine", "bench", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def bench_json(*args, timeout: float = 900):
    """The JSON a successful ``python -m engine bench ARGS`` printed (``--json`` is the caller's to pass)."""
    done = bench(*args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
