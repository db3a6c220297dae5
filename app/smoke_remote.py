"""The smoke test's remote stage: the built-in model served by an in-process ``hearth serve`` on loopback (with an
API key), added as a remote endpoint, answering in a new conversation; screenshots of that conversation
(``chat-remote*.png``), of the dashboard with its remote card (``dashboard-remote.png``) and of the Models page
listing the remote model (``models-remote.png``). The key never appears on screen or in the transcript."""

from __future__ import annotations

import dataclasses
import secrets
import socket
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

from engine.remote import remote_ref

REMOTE_PROMPT = "In one sentence: what is a lighthouse?"
SERVED_NAME = "hearth-builtin"
START_TIMEOUT_S = 120


class RemoteStage(QObject):
    """Serves the built-in model on loopback, chats with it as a remote model and takes the screenshots.

    Args:
        session: the smoke test's AppSession.
        grab, grab_dark: take a screenshot by name; return its file name.
        done: called with the stage's transcript part once the screenshots are taken.
        fail: called with a message when something goes wrong.

    Signals:
        none.
    """

    def __init__(self, session, grab: Callable[[str], str], grab_dark: Callable[[str], str],
                 done: Callable[[dict], None], fail: Callable[[str], None]):
        super().__init__()
        self.session, self.grab, self.grab_dark, self.done, self.fail = session, grab, grab_dark, done, fail
        self.pages: dict[str, str] = {}
        self.server = self.thread = self.model = None
        self.key = "sk-smoke-" + secrets.token_hex(12)

    def start(self) -> None:
        try:
            url = self._serve()
            endpoint = self.session.remote.add(url, self.key)
        except Exception as exc:  # noqa: BLE001 - the smoke test reports any failure and ends
            self.stop_server()
            self.fail(f"the remote stage could not start: {exc}")
            return
        c = self.session.controller
        self.session.window.notice_bar.hide()  # the previous stage's notice
        c.new_conversation()
        c.rename(c.current_id, "A remote model (hearth serve on loopback)")
        c.update_settings(dataclasses.replace(c.settings(), temperature=0.0, max_tokens=60))
        c.model_changed.connect(self._on_model)
        c.set_model(remote_ref(endpoint.id, SERVED_NAME))

    def _serve(self) -> str:
        import uvicorn

        from engine.model import load
        from engine.serve.app import create_app
        from engine.serve.host import ServedModel

        self.model = load(self.session.controller.builtin_path, backend="auto", n_ctx=2048)
        served = ServedModel(self.model, SERVED_NAME, parallel=2, max_queue=8, timeout_s=300)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(served, api_key=self.key), host="127.0.0.1",
                                                    port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="smoke-hearth-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process hearth serve did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}/v1"

    def _on_model(self, info: dict) -> None:
        if not info.get("remote"):
            return
        c = self.session.controller
        c.model_changed.disconnect(self._on_model)
        c.reply_finished.connect(self._on_finished)
        c.send(REMOTE_PROMPT)

    def _on_finished(self, message_id: int, stats: dict) -> None:
        c = self.session.controller
        c.reply_finished.disconnect(self._on_finished)
        if "error" in stats:
            self.stop_server()
            self.fail(f"the remote model failed: {stats['error']}")
            return
        QTimer.singleShot(300, lambda: self._capture(message_id, stats))

    def _capture(self, message_id: int, stats: dict) -> None:
        window, pages = self.session.window, self.pages
        pages["chat-remote"] = self.grab("chat-remote")
        pages["chat-remote-dark"] = self.grab_dark("chat-remote-dark")
        window.show_page("dashboard")
        pages["dashboard-remote"] = self.grab("dashboard-remote")
        card = window.dashboard.remote_card.body.text()
        window.show_page("models")
        pages["models-remote"] = self.grab("models-remote")
        window.show_page("chat")
        self.stop_server()
        reply = self.session.store.message(message_id).content
        if not reply.strip() or "Requests:" not in card:
            self.fail("the remote answer was empty or the dashboard showed no remote card")
            return
        self.done({"note": "the built-in model served by an in-process hearth serve on loopback, used as a remote "
                           "model", "prompt": REMOTE_PROMPT, "reply": reply, "stats": stats,
                   "dashboard_card": card, "screenshots": pages})

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=20)
            self.server = None
        if self.model is not None:
            self.model.close()
            self.model = None
