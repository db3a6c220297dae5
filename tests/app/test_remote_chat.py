"""A remote model in the real window: chatting through the app's controller with ``hearth serve`` and llama.cpp's
``llama-server`` (the answer equals what the server gives the official openai client), Stop, regenerate, edit, the
greyed-out local-only features; faults from a misbehaving server (killed mid-stream, stall, malformed SSE, 429 then
success, wrong key), each with its message, the partial answer kept and marked and the GUI responsive; and no
file Hearth writes holding the API key."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import Qt

from app.logging_setup import setup_logging
from app.models import secrets
from app.models.remote_endpoints import RemoteEndpoints
from engine.remote import remote_ref
from engine.remote.model import sampling_fields
from engine.sampling import SamplingParams
from tests.engine.remote.fake_server import KEY
from tests.engine.remote.servers import SERVED_NAME, FakeServer, hearth_serve, llama_serve

from .gui_ticks import Ticks
from .test_responsiveness import LONGEST_GAP_MS

pytestmark = [pytest.mark.gui, pytest.mark.slow]

TIMEOUT_MS = 120000
MIN_TICKS_PER_S = 30  # issue #24: the event loop runs at 30 Hz or more throughout (and no gap over LONGEST_GAP_MS)


@pytest.fixture(autouse=True)
def key_file(monkeypatch):
    """Keys go to the 0600 file here, never to the keyring of the machine running the tests."""
    monkeypatch.setattr(secrets, "keyring_backend", lambda: None)


@pytest.fixture(scope="module")
def hearth_url():
    with hearth_serve(n_ctx=4096) as url:
        yield url


@pytest.fixture(scope="module")
def llama_url():
    with llama_serve() as url:
        yield url


@pytest.fixture
def fake():
    server = FakeServer().start()
    yield server
    server.kill()


def add_endpoint(data: Path, url: str, key: str | None = None, probe: bool = True, stall_timeout_s: float = 60.0,
                 later_key: str | None = None, headers: tuple[tuple[str, str], ...] = ()):
    """Add the endpoint as the Models page does; ``later_key`` replaces its key afterwards (revoked on the server)."""
    endpoints = RemoteEndpoints(data)
    endpoint = endpoints.add(url, key, headers, probe=probe, stall_timeout_s=stall_timeout_s)
    if later_key:
        endpoints.secrets.set(endpoint.id, later_key)
    return remote_ref(endpoint.id, endpoint.models[0])


def remote_session(make_session, tmp_path, url, **add):
    data = tmp_path / "data"
    ref = add_endpoint(data, url, **add)
    return make_session(data=data, model=ref), ref


def configure(session, **changes):
    c = session.controller
    c.update_settings(dataclasses.replace(c.settings(), **changes))


def send(qtbot, session, text, timeout=TIMEOUT_MS):
    """Type ``text`` and press Return; returns the finished reply's (message id, stats)."""
    edit = session.window.composer.edit
    with qtbot.waitSignal(session.controller.reply_finished, timeout=timeout) as finished:
        edit.setFocus()
        edit.setPlainText(text)
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return finished.args


def openai_answer(url: str, session) -> str:
    """What the server answers the official client for the request the app just sent (same messages and sampling)."""
    c = session.controller
    history = c.history(c.current_id)[:-1]  # without the answer being compared
    fields = sampling_fields(SamplingParams(**c.settings().sampling_kwargs()))
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repeat_penalty") if k in fields}
    reply = openai.OpenAI(base_url=url, api_key="none").chat.completions.create(
        model=SERVED_NAME, messages=history, max_tokens=c.settings().max_tokens, extra_body=extra, **fields)
    return reply.choices[0].message.content


@pytest.mark.parametrize("server", ["hearth_url", "llama_url"])
def test_a_remote_model_chats_like_a_local_one(server, request, qtbot, make_session, tmp_path):
    url = request.getfixturevalue(server)
    session, ref = remote_session(make_session, tmp_path, url)
    c = session.controller
    qtbot.waitUntil(lambda: c.model_info.get("path") == ref, timeout=TIMEOUT_MS)
    assert c.model_info["remote"]["model_id"] == SERVED_NAME and c.model_name() == f"{SERVED_NAME} (remote)"
    configure(session, temperature=0.0, max_tokens=24, system_prompt="You are terse.")
    message_id, stats = send(qtbot, session, "What is the capital of France?")
    message = c.store.message(message_id)
    assert message.state == "complete" and message.content.strip()
    assert message.content == openai_answer(url, session)
    assert stats["generated_tokens"] > 1 and stats["time_to_first_token_s"] > 0 and stats["decode_tps"] > 0
    assert stats["model_name"] == f"{SERVED_NAME} (remote)" and stats["model_file"] == SERVED_NAME
    # edit and resend, then regenerate: both through the same remote path
    question = next(m for m in c.store.messages(c.current_id) if m.role == "user")
    with qtbot.waitSignal(c.reply_finished, timeout=TIMEOUT_MS) as edited:
        c.edit_and_resend(question.id, "What is the capital of Italy?")
    assert c.store.message(edited.args[0]).content == openai_answer(url, session)
    with qtbot.waitSignal(c.reply_finished, timeout=TIMEOUT_MS):
        c.regenerate()
    assert [m.role for m in c.store.messages(c.current_id)] == ["user", "assistant"]
    # what the remote cannot do is greyed out with the reason
    window = session.window
    assert not window.settings_panel.speculation.isEnabled()
    assert "server" in window.settings_panel.speculation.toolTip()
    assert not window.conversation_menu.actions_by_name["save_state"].isEnabled()
    assert not window.dashboard.mode_box.isEnabled() and window.dashboard.remote
    assert window.dashboard.remote_card.isVisibleTo(window.dashboard)
    assert not window.dashboard.cards["thermal"].isVisibleTo(window.dashboard)


def test_stop_closes_the_remote_stream(qtbot, make_session, tmp_path, fake):
    session, _ = remote_session(make_session, tmp_path, fake.url("slow"), probe=False)
    c = session.controller
    with qtbot.waitSignal(c.reply_text, timeout=TIMEOUT_MS):
        edit = session.window.composer.edit
        edit.setPlainText("Count.")
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    with qtbot.waitSignal(c.reply_finished, timeout=TIMEOUT_MS) as finished:
        qtbot.keyClick(session.window.composer.edit, Qt.Key.Key_Escape)
    message = c.store.message(finished.args[0])
    assert message.state == "stopped" and message.content.strip()
    qtbot.waitUntil(lambda: fake.stats()["disconnected"] == 1, timeout=10000)  # the server saw it


@pytest.mark.parametrize("mode, words, kept", [
    ("die", "broke mid-answer", True),
    ("stall", "sent nothing for 1 s", True),
    ("malformed", "cannot read", True),
    ("auth", "refused the API key", False),
])
def test_faults_are_clear_keep_the_partial_answer_and_the_window_responsive(mode, words, kept, qtbot, make_session,
                                                                             tmp_path, fake):
    keys = {"key": KEY, "later_key": "sk-wrong-key"} if mode == "auth" else {}
    session, _ = remote_session(make_session, tmp_path, fake.url(mode), probe=False, stall_timeout_s=1.0, **keys)
    c = session.controller
    notices = []
    c.notice.connect(lambda kind, text: notices.append((kind, text)))
    if mode == "die":  # killed once text has arrived
        c.reply_text.connect(lambda message_id, text: fake.kill() if len(text) > 30 and fake.process.poll() is None
                             else None)
    ticks = Ticks()
    qtbot.waitExposed(session.window)  # the window's first paint and the remote model's load are not the fault
    qtbot.waitUntil(lambda: bool(c.model_info), timeout=TIMEOUT_MS)
    qtbot.wait(200)
    ticks.start()
    message_id, stats = send(qtbot, session, "Hello?")
    qtbot.wait(max(0, 1100 - ticks.clock.elapsed()))  # at least one whole second around the fault, for the rate
    gap = ticks.stop()
    message = c.store.message(message_id)
    assert message.state == "error" and words in stats["error"]
    assert any(kind == "error" and words in text for kind, text in notices)
    if kept:
        assert message.content.startswith("Hello") and "The answer so far is kept." in stats["error"]
    assert gap <= LONGEST_GAP_MS and ticks.min_per_second() >= MIN_TICKS_PER_S, (
        f"{mode}: longest gap {gap} ms, {ticks.min_per_second()} ticks in the slowest second\n{ticks.culprits()}")
    widget = session.window.chat_view.widgets[message_id]
    assert widget.body.markdown == message.content


def test_429_then_success(qtbot, make_session, tmp_path, fake):
    session, _ = remote_session(make_session, tmp_path, fake.url("busy"), probe=False)
    message_id, stats = send(qtbot, session, "Hello?")
    assert session.controller.store.message(message_id).content == "Hello, partial world!"
    assert stats["finish_reason"] == "stop" and fake.stats()["busy_calls"] == 2


@pytest.fixture
def debug_log_file(tmp_path):
    """The app's log file on the root logger at debug level (the most a log can say), for this test only: later
    tests must not log into a directory pytest may have deleted."""
    root = logging.getLogger()
    level = root.level
    setup_logging(tmp_path / "data" / "logs", debug=True)
    yield
    for handler in [h for h in root.handlers if getattr(h, "hearth_log", False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def test_no_file_hearth_writes_holds_the_key(qtbot, make_session, tmp_path, fake, debug_log_file):
    data = tmp_path / "data"
    header = "hdr-secret-7f3a9c"  # an Authorization-like custom header: kept beside the key, like it
    session, ref = remote_session(make_session, tmp_path, fake.url("auth"), key=KEY, probe=False,
                                  headers=(("X-Api-Token", header),))
    message_id, _ = send(qtbot, session, "Hello?")
    assert session.controller.store.message(message_id).content == "Hello, partial world!"
    exports = tmp_path / "exports"
    exports.mkdir()
    assert session.actions.export_json(str(exports / "c.json"))
    assert session.actions.export_markdown(str(exports / "c.md"))
    assert session.actions.export_all(str(exports / "all.zip"))
    session.actions.wait_for_exports()
    session.window.grab().save(str(exports / "window.png"))
    session.close()
    key_file = data / secrets.SECRETS_FILE
    assert header in key_file.read_text() and KEY in key_file.read_text()  # the fallback store, this user's only
    assert key_file.stat().st_mode & 0o777 == 0o600
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != key_file]
    assert len(written) > 5
    leaks = [str(p) for p in written if KEY.encode() in p.read_bytes() or header.encode() in p.read_bytes()]
    assert not leaks


def test_adding_an_endpoint_from_the_models_page_runs_off_the_gui_thread(qtbot, make_session, tmp_path, fake,
                                                                         monkeypatch):
    session = make_session(data=tmp_path / "data")
    window = session.window
    answers = iter([(fake.url("auth"), "sk-wrong", "", False), (fake.url("auth"), KEY, "X-Team: blue", False)])

    class Dialog:  # the form as the user fills it in
        def __init__(self, where, parent):
            assert "remote-keys.json" in where or "keyring" in where
            self.typed = next(answers)

        def exec(self):
            return True

        def values(self):
            return self.typed

        def deleteLater(self):
            pass

    monkeypatch.setattr("app.ui.main_window.RemoteEndpointDialog", Dialog)
    window.show_page("models")
    with qtbot.waitSignal(window.remote_bridge.failed, timeout=TIMEOUT_MS) as failed:
        qtbot.mouseClick(window.models_page.findChild(type(window.models_page.use_button), "addRemote"),
                         Qt.MouseButton.LeftButton)
    assert "refused the API key" in failed.args[0] and "refused the API key" in window.models_page.message.text()
    with qtbot.waitSignal(window.remote_bridge.added, timeout=TIMEOUT_MS):
        window.models_page.add_remote_requested.emit()
    rows = [window.models_page.list.item(i).text() for i in range(window.models_page.list.count())]
    assert any(row.startswith("fake (remote)") for row in rows) and "2 models" in window.models_page.message.text()
    assert KEY not in (tmp_path / "data" / "remote-endpoints.json").read_text()
    fake.kill()  # Refresh lists every endpoint again, off the GUI thread: this one is gone now
    with qtbot.waitSignal(window.remote_bridge.refreshed, timeout=TIMEOUT_MS) as refreshed:
        window.models_page.refresh_requested.emit()
    assert refreshed.args[0].startswith("Could not reach") and "Cannot reach" in window.models_page.list.item(
        next(i for i in range(window.models_page.list.count())
             if window.models_page.list.item(i).text().startswith("fake (remote)"))).text()


def test_a_remote_reasoning_models_thinking_is_folded_apart(qtbot, make_session, tmp_path, fake):
    session, _ = remote_session(make_session, tmp_path, fake.url("thinking"), probe=False)
    message_id, stats = send(qtbot, session, "Hello?")
    message = session.controller.store.message(message_id)
    assert message.thinking == "The user greets." and message.content == "Hello!" and message.state == "complete"
