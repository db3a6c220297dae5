"""The GUI thread's longest pause, not its average rate: a 10 ms timer on it never waits more than LONGEST_GAP_MS between
ticks while a model loads, a model is switched, a long prompt is prefilled, a KV snapshot is saved, a long
conversation is exported and a big text is pasted. A failure names what every thread was doing while ticks were
late (``gui_ticks.Ticks.culprits``)."""

import json
import os

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication

from tests.model_store import model_path

from .gui_ticks import Ticks

pytestmark = pytest.mark.slow

# Issue #25's bound, for all six operations. Measured on a 2-core machine shared with other helpers' runs, after the
# vocabulary's string index, the GGUF string split and UTF-8 check, the BPE merge index (now built with the model)
# and the load's page-in of the weights moved into C with the GIL released (engine/backends/cpu/csrc/strings.c):
# 2 cores: load 14-98 (the 98 before the page-in moved to C), switch 12-23, prefill 20-47, snapshot 15-43, export
# 11-17, paste 12-27 ms; pinned to one core (taskset -c 0): load 19-46, prefill 16-39, all others under 25 ms; beside
# two CPU-bound processes: at most 78 ms. Whole-suite CI runs had held the first load (68-191 ms) and the prefill
# (29-116 ms) only to 300 ms; on this machine the old Python index stayed under 100 ms in every run tried (20-64 ms).
# Later the load failed about one run in three (72-107 ms): a full garbage collection walking the ~115,000 objects of
# the imports, triggered by the loader thread, 70-80 ms with the GIL held. With them frozen after start-up
# (app_session.freeze_startup_objects) three runs of this file: load 20-25, switch 13-14, prefill 29-38 ms.
LONGEST_GAP_MS = 100
BOUNDS_MS: dict[str, int] = {}  # per-operation exceptions to LONGEST_GAP_MS: none
LOADS = 300000
PROMPT = "Summarise this text. " + "The quick brown fox jumps over the lazy dog near the river bank. " * 40


@pytest.fixture
def ticks():
    return Ticks()


def check(gaps: dict[str, int], culprits: dict[str, str], name: str, ticks: Ticks) -> None:
    """Record ``name``'s longest gap, and what the threads did during its longest gaps when it is over the bound.

    With ``HEARTH_TEST_GAPS=FILE`` every gap and its culprits are appended to FILE as a JSON line, passing or not:
    how the bounds above are measured in a whole-suite run."""
    gaps[name] = ticks.stop()
    if gaps[name] > BOUNDS_MS.get(name, LONGEST_GAP_MS):
        culprits[name] = ticks.culprits()
    if os.environ.get("HEARTH_TEST_GAPS"):
        with open(os.environ["HEARTH_TEST_GAPS"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"operation": name, "gap_ms": gaps[name], "culprits": ticks.culprits()}) + "\n")


def assert_responsive(gaps: dict[str, int], culprits: dict[str, str]) -> None:
    """Every operation measured (one over the bound does not hide another), then the bound for each."""
    over = {name: gap for name, gap in gaps.items() if gap > BOUNDS_MS.get(name, LONGEST_GAP_MS)}
    assert not over, f"{gaps}\n" + "\n".join(f"{k}: {v}" for k, v in culprits.items())


def test_model_load_switch_prefill_and_snapshot_save(qtbot, make_session, ticks, tmp_path):
    session = make_session(start=False)
    c = session.controller
    gaps, culprits = {}, {}
    ticks.start()  # (waiting on signals, not polling in Python, so the test itself takes the GIL seldom)
    with qtbot.waitSignal(c.model_changed, timeout=LOADS, check_params_cb=bool):
        session.start()  # the built-in model loads
    check(gaps, culprits, "load", ticks)
    other = str(model_path("qwen25coder"))
    ticks.start()
    with qtbot.waitSignal(c.model_changed, timeout=LOADS, check_params_cb=lambda info: info.get("path") == other):
        c.set_model(other)
    check(gaps, culprits, "switch", ticks)
    ticks.start()
    with qtbot.waitSignal(c.reply_text, timeout=LOADS):
        c.send(PROMPT)
    check(gaps, culprits, "prefill", ticks)
    with qtbot.waitSignal(c.reply_finished, timeout=LOADS):
        c.stop()
    saved = tmp_path / "state.hearth"
    ticks.start()
    with qtbot.waitSignal(session.actions.notice, timeout=LOADS,
                          check_params_cb=lambda kind, text: str(saved) in text or kind == "error") as notice:
        assert session.actions.save_state(str(saved))
    check(gaps, culprits, "snapshot", ticks)
    assert notice.args[0] != "error", notice.args
    assert_responsive(gaps, culprits)


def test_exporting_a_long_conversation_and_a_big_paste(qtbot, make_session, ticks, tmp_path):
    session = make_session(start=False)
    c = session.controller
    store = c.store
    conv = store.create_conversation("long")
    for i in range(1000):
        store.add_message(conv.id, "user" if i % 2 == 0 else "assistant", f"line {i}: " + "words and more words " * 40)
    session.start()
    c.open_conversation(conv.id)
    qtbot.waitUntil(lambda: bool(c.model_info), timeout=LOADS)
    qtbot.wait(1000)  # its 1,000 messages laid out and painted (opening it is not what is measured here)
    gaps, culprits = {}, {}
    target = tmp_path / "long.json"
    ticks.start()
    with qtbot.waitSignal(session.actions.exported, timeout=60000) as exported:
        QTimer.singleShot(20, lambda: session.actions.export_json(str(target)))
    qtbot.wait(50)
    check(gaps, culprits, "export", ticks)
    assert exported.args == [str(target), True] and target.read_text().count('"role"') == 1000
    edit = session.window.composer.edit
    big = "pasted text, line after line\n" * 20000  # ~600 KB
    QGuiApplication.clipboard().setText(big)
    edit.setFocus()
    ticks.start()
    with qtbot.waitSignal(edit.pasted, timeout=60000):
        QTimer.singleShot(20, lambda: qtbot.keyClick(edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier))
    qtbot.wait(50)
    check(gaps, culprits, "paste", ticks)
    assert edit.toPlainText() == big  # all of it, in order
    qtbot.keyClick(session.window.composer.edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert edit.toPlainText() == ""  # the paste is one step to undo
    assert_responsive(gaps, culprits)
