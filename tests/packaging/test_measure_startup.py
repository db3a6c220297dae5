"""measure_startup.py against the app run from source: it prints per-run times and a median (nothing asserted on them)."""

import os
import re
import subprocess
import sys

import pytest

from .conftest import PACKAGING, ROOT


@pytest.mark.slow
@pytest.mark.gui
def test_measure_startup_prints_runs_and_median():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, str(PACKAGING / "measure_startup.py"), "--runs", "2", "--",
                           sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^launch to first painted window \(offscreen\), 2 runs: [\d.]+, [\d.]+ s$", done.stdout, re.MULTILINE)
    assert re.search(r"^startup median: [\d.]+ s$", done.stdout, re.MULTILINE)
