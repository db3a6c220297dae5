"""The start-up probe prints one line when the window first paints."""

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QWidget

from app.startup_probe import StartupProbe, probe_mode

pytestmark = pytest.mark.gui
REPO = Path(__file__).resolve().parents[2]


def test_first_paint_is_reported_once(qtbot):
    window = QWidget()
    qtbot.addWidget(window)
    out = io.StringIO()
    probe = StartupProbe(window, out=out)
    before = time.time()
    with qtbot.waitSignal(probe.painted, timeout=5000) as blocker:
        window.show()
    window.update()
    qtbot.wait(50)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    match = re.fullmatch(r"hearth-startup-probe window-painted epoch=([\d.]+) since_process_start=([\d.]+)", lines[0])
    assert match, lines[0]
    assert before <= float(match[1]) == pytest.approx(blocker.args[0], abs=1e-5)


@pytest.mark.parametrize(("value", "mode"), [("", None), ("0", None), ("1", "print"), ("quit", "quit")])
def test_probe_mode_from_environment(value, mode):
    assert probe_mode({"HEARTH_STARTUP_PROBE": value}) == mode
    assert probe_mode({}) is None


@pytest.mark.slow
def test_the_app_reports_its_first_paint_and_quits_cleanly(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_STARTUP_PROBE": "quit"}
    done = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^hearth-startup-probe window-painted epoch=[\d.]+ since_process_start=[\d.]+$", done.stdout,
                     re.MULTILINE)
    logs = tmp_path / "data" / "logs"
    assert (logs / "hearth.log").is_file()
    assert not (logs / "faults.log").exists()  # the crash handler was uninstalled at a clean exit
    assert not list(logs.glob("crash-*"))
