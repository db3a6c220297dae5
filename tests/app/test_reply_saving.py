"""Streamed text reaches the disk within half a second even when no later piece of text follows it."""

import sqlite3
import time

from PySide6.QtCore import Qt

from app.chat_controller import FLUSH_AGE_S, FLUSH_TICK_S
from app.store import DB_FILENAME

from .fake_engine import FakeFactory, FakeModel


def test_the_promise_fits_the_timer():
    assert FLUSH_AGE_S + FLUSH_TICK_S <= 0.5  # README: a killed process loses at most the last half second


def test_text_followed_by_silence_is_saved_by_the_timer(qtbot, make_session, tmp_path):
    """One piece, then 3 s with no token (a slow model): the piece is on disk long before the next one."""
    session = make_session(engine_factory=FakeFactory(FakeModel(["Hello", " world"], token_s=3.0)))
    arrived = []
    session.controller.reply_text.connect(lambda message_id, text: arrived.append(time.monotonic()))
    edit = session.window.composer.edit
    edit.setPlainText("hi")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bool(arrived), timeout=20000)
    db = sqlite3.connect(tmp_path / "data" / DB_FILENAME)
    on_disk = lambda: db.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchone()  # noqa: E731
    qtbot.waitUntil(lambda: on_disk() == ("Hello",), timeout=2500)  # the next piece comes 3 s after the first
    assert len(arrived) == 1  # saved by the timer, not by a later piece
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000):
        session.controller.stop()


def test_a_piece_right_after_another_is_not_held_until_the_next_token(qtbot, make_session, tmp_path):
    """Two pieces in quick succession, then 3 s of silence: the second is shown and saved without waiting."""
    model = FakeModel(["Hello", " big", " world"], token_s=[0.0, 3.0])
    session = make_session(engine_factory=FakeFactory(model))
    shown = []
    session.controller.reply_text.connect(lambda message_id, text: shown.append(text))
    edit = session.window.composer.edit
    edit.setPlainText("hi")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    db = sqlite3.connect(tmp_path / "data" / DB_FILENAME)
    on_disk = lambda: db.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchone()  # noqa: E731
    qtbot.waitUntil(lambda: on_disk() == ("Hello big",), timeout=2500)  # " world" comes 3 s after " big"
    assert shown[-1] == "Hello big"
    qtbot.waitUntil(lambda: "Hello big" in session.window.chat_view.widgets[_reply_id(session)].message.content,
                    timeout=1000)  # the view renders it within its repaint interval
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000):
        session.controller.stop()


def _reply_id(session):
    return max(session.window.chat_view.widgets)
