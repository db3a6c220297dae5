"""First start: the window shows the built-in model being assembled (in the background), then loads it."""

import dataclasses
import threading

import pytest
from PySide6.QtCore import QTimer

from app import builtin_model as bm
from app.builtin_model import BuiltinModel

from .builtin_parts import install_fake_parts
from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui

CHUNKS = [b"part one " * 3000, b"part two " * 3000, b"the end"]


class GatedModel(BuiltinModel):
    """A built-in model whose assembly waits at its first chunk until the test opens the gate."""

    def __init__(self, *args, gate: threading.Event, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def _write(self, parts, partial, progress, cancelled):
        def gated_progress(done, total):
            progress(done, total)
            if done:
                self.gate.wait(30)

        return super()._write(parts, partial, gated_progress, cancelled)


@pytest.fixture
def spec(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(bm, "CHUNK_BYTES", 2048)
    return install_fake_parts(site, CHUNKS)


def test_first_start_shows_progress_keeps_the_window_responsive_then_loads_the_model(qtbot, make_session, spec,
                                                                                       tmp_path):
    gate = threading.Event()
    builtin = GatedModel(spec, tmp_path / "builtin", gate=gate)
    factory = FakeFactory(FakeModel(["Hi"]))
    session = make_session(engine_factory=factory, builtin=builtin, start=False)
    progress = []
    session.start()
    dialog = session.progress_dialog
    session.assembly.progress.connect(lambda done, total: progress.append((done, total, dialog.value())))
    assert dialog.isVisible() and spec.name in dialog.labelText() and factory.loads == []
    ticks = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start()
    qtbot.waitUntil(lambda: len(ticks) >= 5, timeout=5000)  # the GUI thread runs while the assembly waits
    assert session.assembly.is_running() and not builtin.is_ready()
    c = session.controller
    assert c.send("Hello?") and not c.is_generating()  # the answer waits for the file, it does not fail
    assert session.window.statusBar().currentMessage() == "Preparing the built-in model…"
    with qtbot.waitSignal(c.reply_finished, timeout=20000) as answered:
        gate.set()
    timer.stop()
    assert c.store.message(answered.args[0]).content == "Hi" and c.model_info["path"] == str(builtin.path)
    assert factory.loads == [(str(builtin.path), 4096)]
    assert builtin.is_ready() and builtin.path.read_bytes() == b"".join(CHUNKS)
    assert progress and progress[-1] == (spec.size, spec.size, 1000)  # the bar followed the bytes to the end
    assert [value for _, _, value in progress] == sorted(value for _, _, value in progress)
    assert session.progress_dialog is None and not session.window.notice_bar.isVisible()


def test_a_ready_built_in_model_loads_at_once_without_a_dialog(qtbot, make_session, spec, tmp_path):
    builtin = BuiltinModel(spec, tmp_path / "builtin")
    builtin.ensure()
    factory = FakeFactory(FakeModel(["Hi"]))
    session = make_session(engine_factory=factory, builtin=builtin)
    assert session.assembly is None and session.progress_dialog is None
    qtbot.waitUntil(lambda: factory.loads == [(str(builtin.path), 4096)], timeout=20000)


def test_a_failed_assembly_is_shown_in_the_notice_bar(qtbot, make_session, spec, tmp_path):
    builtin = BuiltinModel(dataclasses.replace(spec, sha256="0" * 64), tmp_path / "builtin")
    factory = FakeFactory(FakeModel(["Hi"]))
    session = make_session(engine_factory=factory, builtin=builtin)
    bar = session.window.notice_bar
    qtbot.waitUntil(lambda: bar.isVisible() and "could not be prepared" in bar.label.text(), timeout=20000)
    assert "sha256" in bar.label.text() and session.progress_dialog is None and factory.loads == []
    assert not builtin.path.exists()


def test_closing_the_window_mid_assembly_cancels_it_and_leaves_no_file(qtbot, make_session, spec, tmp_path):
    gate = threading.Event()
    builtin = GatedModel(spec, tmp_path / "builtin", gate=gate)
    session = make_session(engine_factory=FakeFactory(FakeModel()), builtin=builtin)
    assert session.assembly.is_running()
    threading.Timer(0.3, gate.set).start()  # the worker sees the stop at its next chunk
    session.close()
    assert not session.assembly.is_running() and not builtin.is_ready()
    assert sorted(p.name for p in (tmp_path / "builtin").iterdir()) == []
