"""A test hook: with HEARTH_SCRIPT set, the app sends the scripted prompts itself and reports progress on stdout.

HEARTH_SCRIPT is JSON: ``{"prompts": [{"text": "...", "max_tokens": 8, "temperature": 0.0}, ...]}``. Each prompt is
sent once the previous answer finished; a step ``{"model": PATH}`` instead switches the conversation's model (as the
model menu does) and the script goes on once it is loaded; ``{"new_chat": true}`` opens a new conversation. Every line printed is one JSON object: ``{"event": "sent",
...}`` when a prompt is saved and sent, ``{"event": "text", "message_id": M, "text": DELTA}`` as an answer streams in,
``{"event": "finished", "message_id": M, "content": TEXT}`` when it is saved, ``{"event": "switching", "path": P}``
once the switch is saved and ``{"event": "switched", "path": P}`` when the model is loaded. End-to-end tests kill the
process at these moments and compare the database with what was printed.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from PySide6.QtCore import QObject, QTimer

from .chat_controller import ChatController


class ScriptedSession(QObject):
    """Sends scripted prompts through the controller, as the user would, and prints what happens.

    Signals:
        none.
    """

    def __init__(self, controller: ChatController, script: str):
        super().__init__()
        self.controller = controller
        self.prompts = list(json.loads(script)["prompts"])
        self._shown = {}  # message id -> characters printed so far
        controller.reply_text.connect(self._on_text)
        controller.reply_finished.connect(self._on_finished)

    def start(self) -> None:
        QTimer.singleShot(0, self._next)

    def _next(self) -> None:
        if not self.prompts:
            self._print(event="done")
            return
        prompt = self.prompts.pop(0)
        c = self.controller
        if prompt.get("new_chat"):
            self._print(event="new_chat", conversation_id=c.new_conversation())
            QTimer.singleShot(0, self._next)
            return
        if "model" in prompt:
            c.model_changed.connect(self._on_model_changed)
            c.set_model(prompt["model"])
            self._print(event="switching", path=prompt["model"])
            return
        overrides = {k: prompt[k] for k in ("max_tokens", "temperature", "seed") if k in prompt}
        c.update_settings(dataclasses.replace(c.settings(), **overrides))
        c.send(prompt["text"])
        self._print(event="sent", text=prompt["text"], message_id=c.streaming_message_id())

    def _on_text(self, message_id: int, text: str) -> None:
        shown = self._shown.get(message_id, 0)
        self._print(event="text", message_id=message_id, text=text[shown:])
        self._shown[message_id] = len(text)

    def _on_finished(self, message_id: int, stats: dict) -> None:
        content = self.controller.store.message(message_id).content
        self._print(event="finished", message_id=message_id, content=content, stats=stats)
        QTimer.singleShot(0, self._next)

    def _on_model_changed(self, info: dict) -> None:
        self.controller.model_changed.disconnect(self._on_model_changed)
        self._print(event="switched", path=info.get("path"))
        QTimer.singleShot(0, self._next)

    @staticmethod
    def _print(**fields) -> None:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()
