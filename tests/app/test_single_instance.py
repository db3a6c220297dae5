"""Single instance: one primary per user and data directory; later launches ask it to come forward and exit."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PySide6.QtNetwork import QLocalSocket
from PySide6.QtWidgets import QWidget

from app.single_instance import LOCK_FILENAME, SingleInstance, bring_to_front, server_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def instances(qtbot):
    """Make SingleInstance objects and release them all at the end."""
    made = []

    def make(data_dir):
        instance = SingleInstance(data_dir)
        made.append(instance)
        return instance

    yield make
    for instance in made:
        instance.release()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}


SECOND_LAUNCH = """
    import sys
    from pathlib import Path
    from PySide6.QtCore import QCoreApplication
    from app.single_instance import SingleInstance
    app = QCoreApplication([])
    instance = SingleInstance(Path(sys.argv[1]))
    if instance.acquire():
        sys.exit(2)  # it should have found the lock taken
    sys.exit(0 if instance.activate_running(timeout_s=float(sys.argv[2])) else 3)
"""


def test_server_name_depends_on_user_and_data_dir(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert server_name(a, "ann") == server_name(a, "ann")
    assert server_name(a, "ann") != server_name(b, "ann")
    assert server_name(a, "ann") != server_name(a, "bob")
    assert server_name(a, "ann") == server_name(tmp_path / "x" / ".." / "a", "ann")  # resolved
    name = server_name(a, "a user/with\\odd chars")
    assert name.replace("-", "").isalnum() and len(name) < 50


def test_only_one_primary_per_data_dir(instances, tmp_path):
    first, second, elsewhere = instances(tmp_path), instances(tmp_path), instances(tmp_path / "other")
    (tmp_path / "other").mkdir()
    assert first.acquire() and first.is_primary
    assert not second.acquire() and not second.is_primary
    assert elsewhere.acquire()
    assert (tmp_path / LOCK_FILENAME).is_file()
    first.release()
    assert second.acquire()


def test_activate_request_is_acknowledged_and_signalled(instances, qtbot, tmp_path):
    primary = instances(tmp_path)
    assert primary.acquire()
    client = QLocalSocket()
    with qtbot.waitSignal(primary.activation_requested, timeout=5000):
        client.connectToServer(primary.name)
        client.write(b"activate\n")
        client.flush()
    qtbot.waitUntil(lambda: client.bytesAvailable() > 0, timeout=5000)
    assert bytes(client.readAll()) == b"ok\n"
    client.disconnectFromServer()


def test_unknown_request_is_dropped_without_activation(instances, qtbot, tmp_path):
    primary = instances(tmp_path)
    assert primary.acquire()
    client = QLocalSocket()
    with qtbot.assertNotEmitted(primary.activation_requested, wait=300):
        client.connectToServer(primary.name)
        client.write(b"open /etc/passwd\n")
        client.flush()
        qtbot.waitUntil(lambda: client.state() == QLocalSocket.LocalSocketState.UnconnectedState, timeout=5000)
    assert bytes(client.readAll()) == b""


def test_second_process_activates_the_running_one_and_exits_0(instances, qtbot, tmp_path):
    primary = instances(tmp_path)
    assert primary.acquire()
    with qtbot.waitSignal(primary.activation_requested, timeout=30000):
        second = subprocess.Popen(_python(SECOND_LAUNCH) + [str(tmp_path), "10"], env=_env())
    qtbot.waitUntil(lambda: second.poll() is not None, timeout=30000)
    assert second.returncode == 0


def test_second_process_gives_up_when_the_lock_holder_does_not_answer(tmp_path):
    holder = subprocess.Popen(_python("""
        import sys, time
        from PySide6.QtCore import QLockFile
        lock = QLockFile(sys.argv[1])
        assert lock.tryLock(0)
        print("locked", flush=True)
        time.sleep(120)
    """) + [str(tmp_path / LOCK_FILENAME)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = subprocess.run(_python(SECOND_LAUNCH) + [str(tmp_path), "0.5"], env=_env(), timeout=60, check=False)
        assert second.returncode == 3
    finally:
        holder.kill()
        holder.wait()


def test_lock_and_socket_of_a_killed_primary_are_taken_over(instances, qtbot, tmp_path):
    crashed = subprocess.Popen(_python("""
        import sys, time
        from pathlib import Path
        from PySide6.QtCore import QCoreApplication
        from app.single_instance import SingleInstance
        app = QCoreApplication([])
        instance = SingleInstance(Path(sys.argv[1]))
        assert instance.acquire()
        print("primary", flush=True)
        time.sleep(120)
    """) + [str(tmp_path)], env=_env(), stdout=subprocess.PIPE, text=True)
    assert crashed.stdout.readline().strip() == "primary"
    crashed.send_signal(signal.SIGKILL)
    crashed.wait()
    successor = instances(tmp_path)
    assert successor.acquire()
    with qtbot.waitSignal(successor.activation_requested, timeout=30000):
        second = subprocess.Popen(_python(SECOND_LAUNCH) + [str(tmp_path), "10"], env=_env())
    qtbot.waitUntil(lambda: second.poll() is not None, timeout=30000)
    assert second.returncode == 0


@pytest.mark.gui
@pytest.mark.qt_log_ignore("does not support raise")  # the offscreen plugin
def test_bring_to_front_restores_a_minimized_window(qtbot):
    window = QWidget()
    qtbot.addWidget(window)
    window.showMinimized()
    qtbot.waitUntil(window.isMinimized, timeout=5000)
    bring_to_front(window)
    assert window.isVisible() and not window.isMinimized()


@pytest.mark.slow
@pytest.mark.gui
def test_a_second_launch_of_the_app_shows_the_first_and_exits_0(tmp_path):
    data = tmp_path / "data"
    env = {**_env(), "HEARTH_STARTUP_PROBE": "1"}
    first = subprocess.Popen([sys.executable, "-m", "app", "--data-dir", str(data)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().startswith("hearth-startup-probe window-painted")  # the window is up
        second = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(data)], cwd=ROOT, env=_env(),
                                capture_output=True, text=True, timeout=120, check=False)
        assert second.returncode == 0, second.stderr[-2000:]
        assert first.poll() is None  # the first one keeps running
        log = data / "logs" / "hearth.log"
        deadline = time.monotonic() + 30
        while "another launch asked for the window" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "another launch asked for the window" in log.read_text()
    finally:
        first.kill()
        first.communicate(timeout=60)
