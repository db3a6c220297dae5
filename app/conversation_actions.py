"""Export, import and state snapshots of conversations: the store work here (exports on a thread of their own, so
the GUI thread never waits on encoding a long conversation or on fsync), the engine work through the host."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.session import SessionError, read_conversation

from . import conversation_export as ce
from .chat_controller import ChatController
from .builtin_model import BUILTIN_MODEL_NAME
from .model_names import display_name
from .qt_compat import emit
from .store import Conversation, ConversationStore


class ConversationActions(QObject):
    """What the conversation menu offers, for the shown conversation or all of them; no widgets.

    Signals:
        notice(str, str): kind ("info", "warning", "error") and a message for the user.
        state_done(str, bool): a snapshot path and whether saving or restoring its state worked.
        exported(str, bool): an export's path and whether it was written (after its notice).
    """

    notice = Signal(str, str)
    state_done = Signal(str, bool)
    exported = Signal(str, bool)

    def __init__(self, controller: ChatController, parent: QObject | None = None):
        super().__init__(parent)
        self.controller = controller
        self.store = controller.store
        self._pending: dict[str, tuple[str, int]] = {}  # snapshot path -> ("save" | "restore", conversation id)
        self._exports: list[threading.Thread] = []
        host = controller.host
        host.state_saved.connect(self._on_saved)
        host.state_restored.connect(self._on_restored)
        host.state_failed.connect(self._on_failed)

    # -- model identity --------------------------------------------------------------------------------
    def model_identity(self, conv: Conversation) -> ce.ModelIdentity | None:
        """The conversation's model by name, and by sha256 when it is the loaded model (hashed at load)."""
        path = conv.model_path or self.controller.default_model
        if not path:
            return None
        file = Path(path).name
        info = self.controller.model_info
        if info.get("path") == path and info.get("sha256"):
            return ce.ModelIdentity(info.get("name") or file, info["sha256"], file)
        name = BUILTIN_MODEL_NAME if path == self.controller.builtin_path else display_name(None, path)
        return ce.ModelIdentity(name, None, file)

    def _model_path_for(self, imported: ce.ImportedConversation) -> tuple[str | None, str | None]:
        """The model path an imported conversation gets (None: the default), and a notice when it differs."""
        info = self.controller.model_info
        model = imported.model
        if model and model.sha256 and model.sha256 == info.get("sha256"):
            path = info["path"]
            return (None if path == self.controller.default_model else path), None
        if model is None:
            return None, None
        return None, (f"“{imported.title}” was held with {model.name}; it continues with "
                      f"{self.controller.model_name()} here.")

    # -- export ----------------------------------------------------------------------------------------
    def export_json(self, path: str) -> bool:
        """Start exporting the shown conversation as JSON; False when none is shown. ``exported`` follows."""
        return self._export("JSON", path, ce.export_json)

    def export_markdown(self, path: str) -> bool:
        """Start exporting the shown conversation as Markdown; False when none is shown. ``exported`` follows."""
        return self._export("Markdown", path, ce.export_markdown)

    def _export(self, kind: str, path: str, write) -> bool:
        cid = self.controller.current_id
        if cid is None:
            return False
        identity = self.model_identity(self.store.conversation(cid))

        def job(store: ConversationStore) -> str:
            write(store, cid, path, identity)
            return f"Exported the conversation as {kind} to {path}."
        self._start_export(path, job)
        return True

    def export_all(self, path: str) -> bool:
        """Start exporting every conversation as one archive; ``exported`` follows."""
        identities = {conv.id: self.model_identity(conv) for conv in self.store.conversations()}

        def job(store: ConversationStore) -> str:
            n = ce.export_archive(store, path, lambda conv: identities.get(conv.id))
            return f"Exported {n} conversations to {path}."
        self._start_export(path, job)
        return True

    def _start_export(self, path: str, job: Callable[[ConversationStore], str]) -> None:
        """Run ``job`` on a thread with its own connection to the store (WAL: it reads while replies are written)."""
        def run() -> None:
            try:
                store = ConversationStore(self.store.path)
                try:
                    message = job(store)
                finally:
                    store.close()
            except (OSError, sqlite3.Error) as e:
                emit(self.notice, "error", f"Could not export to {path}: {getattr(e, 'strerror', None) or e}")
                emit(self.exported, path, False)
                return
            emit(self.notice, "info", message)
            emit(self.exported, path, True)
        self._exports = [t for t in self._exports if t.is_alive()]
        thread = threading.Thread(target=run, name="hearth-export", daemon=True)
        self._exports.append(thread)
        thread.start()

    def wait_for_exports(self) -> None:
        """Wait until every export started so far is written (at shutdown, so none is cut off)."""
        for thread in self._exports:
            thread.join()

    # -- import ----------------------------------------------------------------------------------------
    def import_file(self, path: str) -> int | None:
        """Import an exported conversation (.json) as a new conversation and open it; its id, or None."""
        try:
            imported = ce.read_json_file(path)
        except (OSError, ce.ConversationFormatError) as e:
            emit(self.notice, "error", f"Could not import {Path(path).name}: {_reason(e)}")
            return None
        conv = self._add(imported)
        emit(self.notice, "info", f"Imported “{conv.title}” ({len(imported.messages)} messages).")
        return conv.id

    def import_archive(self, path: str) -> list[int]:
        """Import every conversation of an archive (all or none); their ids."""
        try:
            conversations = ce.read_archive(path)
        except (OSError, ce.ConversationFormatError) as e:
            emit(self.notice, "error", f"Could not import {Path(path).name}: {_reason(e)}")
            return []
        ids = [self._add(c, open_it=False).id for c in conversations]
        if ids:
            self.controller.open_conversation(ids[0])
        emit(self.notice, "info", f"Imported {len(ids)} conversations from {Path(path).name}.")
        return ids

    def _add(self, imported: ce.ImportedConversation, open_it: bool = True) -> Conversation:
        model_path, note = self._model_path_for(imported)
        conv = ce.add_to_store(self.store, imported, model_path)
        if note:
            emit(self.notice, "info", note)
        if open_it:
            self.controller.open_conversation(conv.id)
        return conv

    # -- state snapshots -------------------------------------------------------------------------------
    def save_state(self, path: str) -> bool:
        """Snapshot the shown conversation (text and KV state) to ``path``; the answer comes as a notice."""
        c = self.controller
        cid, model_path = c.current_id, c.model_path()
        if cid is None or not model_path:
            emit(self.notice, "error", "There is no model to save a state of.")
            return False
        if c.is_generating():
            emit(self.notice, "warning", "Wait for the answer to finish (or stop it) before saving the state.")
            return False
        document = ce.conversation_document(self.store, cid, self.model_identity(self.store.conversation(cid)))
        self._pending[path] = ("save", cid)
        emit(c.status, "Saving the conversation's state…")
        c.host.save_state(cid, model_path, c.settings().n_ctx, path, c.history(cid), document)
        return True

    def restore_state(self, path: str) -> int | None:
        """Import a snapshot's conversation as a new one, then restore its KV state into the model.

        If the engine refuses the state (another model, a damaged file…), the text stays imported and the
        history is re-processed with the next answer; the notice gives the engine's reason.
        """
        try:
            imported = ce.from_document(read_conversation(path))
        except (OSError, SessionError, ce.ConversationFormatError) as e:
            emit(self.notice, "error", f"Could not open {Path(path).name}: {_reason(e)}")
            return None
        conv = self._add(imported)
        self._pending[path] = ("restore", conv.id)
        c = self.controller
        emit(c.status, "Restoring the conversation's state…")
        c.host.restore_state(conv.id, c.model_path(), c.settings().n_ctx, path)
        return conv.id

    @Slot(int, str, object)
    def _on_saved(self, conversation_id: int, path: str, info: dict) -> None:
        if self._pending.pop(path, None) is None:
            return
        emit(self.controller.status, "Ready")
        emit(self.notice, "info", f"Saved the conversation and its state ({info['tokens']:,} tokens, "
                                  f"{info['bytes'] / 1e6:.1f} MB) to {path}.")
        emit(self.state_done, path, True)

    @Slot(int, str, object)
    def _on_restored(self, conversation_id: int, path: str, info: dict) -> None:
        if self._pending.pop(path, None) is None:
            return
        emit(self.controller.status, "Ready")
        emit(self.notice, "info", f"Restored the conversation with its state ({info['tokens']:,} tokens): the next "
                                  "answer continues without re-reading the history.")
        emit(self.state_done, path, True)

    @Slot(int, str, str)
    def _on_failed(self, conversation_id: int, path: str, reason: str) -> None:
        pending = self._pending.pop(path, None)
        if pending is None:
            return
        emit(self.controller.status, "Ready")
        if pending[0] == "save":
            emit(self.notice, "error", f"Could not save the state to {path}: {reason}")
        else:
            emit(self.notice, "warning", f"The conversation was imported as text, but its saved state could not be "
                                         f"used: {reason}. Hearth will re-process the history with the next answer.")
        emit(self.state_done, path, False)



def _reason(e: Exception) -> str:
    if isinstance(e, OSError):
        return e.strerror or str(e)
    text = str(e)
    return text[0].upper() + text[1:] if text else type(e).__name__
