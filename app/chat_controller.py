"""The chat controller: turns the user's intents into store writes and engine requests; no widgets.

It owns the conversation being shown and the replies being generated, at most one per conversation (the
others keep streaming when the user switches away, and replies on the same model run together, batched by the
engine's scheduler), and saves each reply as it streams.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine.context import reply_room
from engine.reasoning import ReasoningProfile, ReasoningSplitter
from engine.remote import is_remote_ref, parse_remote_ref
from engine.thermal import Mode

from .chat_settings import ChatSettings
from .builtin_model import BUILTIN_MODEL_NAME
from .model_names import display_name
from .qt_compat import emit
from .store import ConversationStore, Message, ReplyWriter
from .engine_host import EngineHost

TITLE_CHARS = 48
# Streamed text reaches the disk within FLUSH_AGE_S + FLUSH_TICK_S = 0.45 s even when no later piece arrives
# (a slow model, another conversation's prefill): the README promises at most the last half second lost.
FLUSH_TICK_S = 0.1
FLUSH_AGE_S = 0.35
THERMAL_MODES = tuple(m.value for m in Mode)  # performance, balanced, cool


@dataclasses.dataclass
class _Reply:
    request_id: int
    conversation_id: int
    writer: ReplyWriter
    model: tuple[str, int]  # the model path and context length it runs on
    streaming: bool = False  # the first text has arrived


class ChatController(QObject):
    """Conversation logic between the views, the store and the engine host.

    Signals:
        conversations_changed(): the list of conversations (titles, order, membership, which are answering) changed.
        conversation_opened(int): the shown conversation changed; views reload ``messages()``.
        messages_changed(int): a conversation's messages were added, edited or deleted.
        reply_text(int, str): message id and the whole answer so far of the streaming reply.
        reply_thinking(int, str, bool): message id, the whole thinking so far of the streaming reply, and whether
            it is still thinking (emitted only for models whose template has a reasoning syntax).
        generating_changed(bool): whether a reply is being generated for the shown conversation.
        model_changed(dict): the loaded model's info (path, name, n_ctx, notices); {} while none is loaded.
        status(str): a short line for the status bar.
        notice(str, str): kind ("info", "warning", "error") and a message for the user.
        context_usage(int, int, int): tokens used, the context length and the tokens it keeps for the reply, for
            the shown conversation.
        conversation_deleted(int, str): id and title, so the view can offer to undo.
        reply_finished(int, dict): message id and stats of a finished reply.
    """

    conversations_changed = Signal()
    conversation_opened = Signal(int)
    messages_changed = Signal(int)
    reply_text = Signal(int, str)
    reply_thinking = Signal(int, str, bool)
    generating_changed = Signal(bool)
    model_changed = Signal(object)
    status = Signal(str)
    notice = Signal(str, str)
    context_usage = Signal(int, int, int)
    conversation_deleted = Signal(int, str)
    reply_finished = Signal(int, object)

    def __init__(self, store: ConversationStore, host: EngineHost, default_model: str | None,
                 builtin_path: str | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.host = host
        self.default_model = default_model
        self.builtin_path = builtin_path
        self.pending_model: str | None = None  # a model file still being prepared (the built-in, on first start)
        self._deferred: int | None = None  # the conversation whose answer waits for the pending model
        self.current_id: int | None = None
        self.model_info: dict = {}
        self._replies: dict[int, _Reply] = {}  # by conversation id
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(int(FLUSH_TICK_S * 1000))
        self._flush_timer.timeout.connect(self._flush_replies)
        host.loaded.connect(self._on_loaded)
        host.load_failed.connect(self._on_load_failed)
        host.tokens.connect(self._on_tokens)
        host.finished.connect(self._on_finished)
        host.error.connect(self._on_error)
        host.progress.connect(self.status)
        host.restarted.connect(lambda text: emit(self.notice, "error", text))

    # -- start-up ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the last conversation (or a new one) and load its model in the background."""
        last = self.store.setting("last_conversation")
        ids = [c.id for c in self.store.conversations()]
        self.open_conversation(last if last in ids else (ids[0] if ids else self.new_conversation()))
        self.preload()

    def model_ready(self, path: str) -> None:
        """The pending model file is ready: load it if the shown conversation uses it, and answer what waited."""
        self.pending_model = None
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred == self.current_id and self.model_path() == path:
            self._generate()
        elif self.model_path() == path:
            self.preload()

    def preload(self) -> None:
        path = self.model_path()
        if path and path == self.pending_model:
            emit(self.status, "Preparing the built-in model…")
        elif path:
            emit(self.status, "Loading the model…")
            self.host.load(path, self.settings().n_ctx)
        else:
            emit(self.notice, "error", "No model is available: the built-in model is not installed. "
                                      "Open a GGUF file on the Models page.")

    # -- queries for the views -------------------------------------------------------------------------
    def messages(self) -> list[Message]:
        """The shown conversation's messages, with the live text of a reply still streaming."""
        if self.current_id is None:
            return []
        messages = self.store.messages(self.current_id)
        reply = self._replies.get(self.current_id)
        if reply is not None:
            live = reply.writer
            messages = [dataclasses.replace(m, content=live.text, thinking=live.thinking) if m.id == live.message_id
                        else m for m in messages]
        return messages

    def settings(self) -> ChatSettings:
        return self.store.conversation(self.current_id).settings if self.current_id else self.default_settings()

    def default_settings(self) -> ChatSettings:
        """The app-wide settings new conversations start from."""
        return self.store.default_settings()

    def set_default_settings(self, settings: ChatSettings) -> None:
        """Change what new conversations start from; existing conversations keep their own settings."""
        self.store.set_default_settings(settings)

    def model_path(self) -> str | None:
        if self.current_id is not None:
            path = self.store.conversation(self.current_id).model_path
            if path:
                return path
        return self.default_model

    def model_name(self) -> str:
        """A readable name for the shown conversation's model, loaded or not."""
        path = self.model_path()
        return self._display_name(path) if path else "No model"

    def reasoning(self) -> ReasoningProfile:
        """How the loaded model's chat template handles reasoning (none while no model is loaded)."""
        return ReasoningProfile.from_dict(self.model_info.get("reasoning"))

    def is_generating(self) -> bool:
        """Whether the shown conversation has a reply being generated."""
        return self.current_id in self._replies

    def answering(self) -> frozenset[int]:
        """The conversations whose reply is being generated (the shown one and any in the background)."""
        return frozenset(self._replies)

    def streaming_message_id(self) -> int | None:
        """The shown conversation's streaming reply, if any."""
        reply = self._replies.get(self.current_id)
        return reply.writer.message_id if reply else None

    # -- conversations -------------------------------------------------------------------------------
    def new_conversation(self) -> int:
        """Open a new, empty conversation (the shown one, when it is still empty) and return its id."""
        if self.current_id is not None and not self.store.messages(self.current_id):
            self.open_conversation(self.current_id)
            return self.current_id
        current = self.store.conversation(self.current_id) if self.current_id else None
        # None means "the default model", so the built-in model's path is not frozen into every conversation; the
        # settings are the app-wide defaults, never the last chat's system prompt or sampling
        conv = self.store.create_conversation("New chat", current.model_path if current else None,
                                              self.store.default_settings())
        emit(self.conversations_changed)
        self.open_conversation(conv.id)
        return conv.id

    def open_conversation(self, conversation_id: int) -> None:
        self.current_id = conversation_id
        self.store.set_setting("last_conversation", conversation_id)
        self.host.activate(conversation_id)  # the worker swaps this conversation's KV state in early
        emit(self.conversation_opened, conversation_id)
        emit(self.generating_changed, self.is_generating())
        self._emit_context_usage()

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename(conversation_id, title)
        emit(self.conversations_changed)

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete (undoably); the shown conversation moves to the next one or a new one."""
        if conversation_id in self._replies:
            self.stop(conversation_id)
        title = self.store.conversation(conversation_id).title
        self.store.delete_conversation(conversation_id)
        emit(self.conversations_changed)
        emit(self.conversation_deleted, conversation_id, title)
        if self.current_id == conversation_id:
            rest = self.store.conversations()
            self.open_conversation(rest[0].id if rest else self.new_conversation())

    def undo_delete(self, conversation_id: int) -> None:
        self.store.undo_delete(conversation_id)
        emit(self.conversations_changed)
        self.open_conversation(conversation_id)

    def update_settings(self, settings: ChatSettings) -> None:
        if self.current_id is not None:
            self.store.set_settings(self.current_id, settings.clamped())

    def thermal_mode(self) -> str:
        """The app-wide thermal mode: "performance", "balanced" (default) or "cool" (engine.thermal.Mode values)."""
        mode = self.store.setting("thermal_mode", THERMAL_MODES[1])
        return mode if mode in THERMAL_MODES else THERMAL_MODES[1]

    def set_thermal_mode(self, mode: str) -> None:
        """Remember ``mode``; the engine switches to it with the next reply."""
        if mode not in THERMAL_MODES:
            raise ValueError(f"unknown thermal mode {mode!r}; expected one of {', '.join(THERMAL_MODES)}")
        self.store.set_setting("thermal_mode", mode)

    def set_model(self, path: str) -> None:
        """Use the GGUF at ``path`` for the shown conversation and load it now."""
        if self.current_id is not None:
            self.store.set_model_path(self.current_id, None if path == self.default_model else path)
        self.preload()

    # -- messages ------------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Add a user message to the shown conversation and start the reply. False if there is nothing to send."""
        text = text.strip()
        if not text or self.current_id is None:
            return False
        conv = self.store.conversation(self.current_id)
        self.store.add_message(conv.id, "user", text)
        if conv.title == "New chat":
            self.store.rename(conv.id, _title_from(text))
        emit(self.conversations_changed)
        emit(self.messages_changed, conv.id)
        self._generate()
        return True

    def stop(self, conversation_id: int | None = None) -> None:
        """Stop the answer of the shown conversation (or of ``conversation_id``). Before its first text (the
        prompt is still being read, which the engine only notices between prefill chunks) the window is freed at
        once and the empty answer dropped."""
        reply = self._replies.get(self.current_id if conversation_id is None else conversation_id)
        if reply is None:
            return
        if reply.writer.text or reply.writer.thinking:
            self.host.stop(reply.request_id)
        else:
            self.stop_and_forget(reply.conversation_id)

    def regenerate(self) -> None:
        """Answer the last question of the shown conversation again; the earlier answers stay as alternatives."""
        messages = self.store.messages(self.current_id)
        users = [m for m in messages if m.role == "user"]
        if not users:
            return
        self.stop_and_forget()
        self.store.keep_answers_as_alternatives(self.current_id, users[-1].id)
        self.store.delete_messages_after(self.current_id, users[-1].seq, shown_only=True)  # failed, empty ones
        emit(self.messages_changed, self.current_id)
        self._generate()

    def show_alternative(self, message_id: int, step: int) -> None:
        """Show the answer ``step`` places before (-1) or after (+1) ``message_id`` among its turn's answers."""
        message = self.store.message(message_id)
        if message.conversation_id in self._replies:
            return  # its reply is streaming; flip once it is done
        answers = self.store.alternatives(message_id)
        index = next(i for i, m in enumerate(answers) if m.id == message_id) + step
        if 0 <= index < len(answers):
            self.store.show_alternative(answers[index].id)
            emit(self.messages_changed, message.conversation_id)
            self._emit_context_usage()

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user message's text, drop everything after it and answer again."""
        text = text.strip()
        message = self.store.message(message_id)
        if not text or message.role != "user":
            return
        self.stop_and_forget(message.conversation_id)
        self.store.update_message(message_id, content=text)
        self.store.delete_messages_after(message.conversation_id, message.seq)
        emit(self.messages_changed, message.conversation_id)
        self._generate()

    def delete_message(self, message_id: int) -> None:
        message = self.store.message(message_id)
        if any(r.writer.message_id == message_id for r in self._replies.values()):
            self.stop_and_forget(message.conversation_id)
        self.store.delete_message(message_id)
        emit(self.messages_changed, message.conversation_id)
        self._emit_context_usage()

    def stop_and_forget(self, conversation_id: int | None = None) -> None:
        """Stop the reply of the shown conversation (or of ``conversation_id``) and detach from it: its remaining
        events are ignored, its text is kept."""
        reply = self._replies.pop(self.current_id if conversation_id is None else conversation_id, None)
        if reply is None:
            return
        self.host.stop(reply.request_id)
        if reply.writer.text or reply.writer.thinking:
            reply.writer.finish("stopped", {"finish_reason": "cancelled"})
        else:
            self.store.delete_message(reply.writer.message_id)
        emit(self.status, "Stopped")
        emit(self.conversations_changed)
        if reply.conversation_id == self.current_id:
            emit(self.generating_changed, False)
        emit(self.messages_changed, reply.conversation_id)

    def history(self, conversation_id: int) -> list[dict]:
        """The conversation as the model sees it: the system prompt, then every message with text."""
        conv = self.store.conversation(conversation_id)
        history = [{"role": m.role, "content": m.content} for m in self.store.messages(conv.id)
                   if m.content and m.state != "error"]
        if conv.settings.system_prompt.strip():
            history.insert(0, {"role": "system", "content": conv.settings.system_prompt.strip()})
        return history

    # -- engine events -------------------------------------------------------------------------------
    def _generate(self) -> None:
        self.stop_and_forget()
        conv = self.store.conversation(self.current_id)
        path = self.model_path()
        if not path:
            emit(self.notice, "error", "No model to answer with. Open a GGUF file on the Models page.")
            return
        if path == self.pending_model:  # answered once the file is ready (model_ready)
            self._deferred = conv.id
            emit(self.status, "Preparing the built-in model…")
            return
        model = (path, conv.settings.n_ctx)
        for other in [r for r in self._replies.values() if r.model != model]:  # one model at a time
            self.stop_and_forget(other.conversation_id)
        history = self.history(conv.id)
        options = {**conv.settings.sampling_kwargs(), "max_tokens": conv.settings.max_tokens,
                   "speculation": conv.settings.speculation_options(), "conversation_id": conv.id,
                   "thermal_mode": self.thermal_mode(), "template_vars": conv.settings.template_options()}
        question = next((m.id for m in reversed(self.store.messages(conv.id)) if m.role == "user"), None)
        writer = self.store.begin_reply(conv.id, reply_to=question)
        request_id = self.host.generate(path, conv.settings.n_ctx, history, options)
        self._replies[conv.id] = _Reply(request_id, conv.id, writer, model)
        self._flush_timer.start()
        emit(self.conversations_changed)  # the sidebar marks the conversations that are answering
        emit(self.messages_changed, conv.id)
        emit(self.generating_changed, True)
        emit(self.status, "Thinking…")

    def _current_reply(self, request_id: int) -> _Reply | None:
        return next((r for r in self._replies.values() if r.request_id == request_id), None)

    @Slot(int, str)
    def _on_tokens(self, request_id: int, text: str) -> None:
        reply = self._current_reply(request_id)
        if reply is None:
            return
        if not reply.streaming:  # the model is loaded now (its "loaded" came first): read its reasoning syntax
            reply.streaming = True
            reply.writer.splitter = self._splitter(reply.conversation_id)
            emit(self.status, "Answering…  (Esc to stop)")
        writer = reply.writer
        writer.append(text)
        if reply.conversation_id == self.current_id:
            if writer.splitter.syntax is not None:
                emit(self.reply_thinking, writer.message_id, writer.thinking, writer.in_thinking)
            emit(self.reply_text, writer.message_id, writer.text)

    def _splitter(self, conversation_id: int) -> ReasoningSplitter:
        profile = self.reasoning()
        enable = self.store.conversation(conversation_id).settings.enable_thinking
        return ReasoningSplitter(profile.syntax, profile.opens(enable if profile.has_switch else None))

    @Slot(int, object)
    def _on_finished(self, request_id: int, stats: dict) -> None:
        reply = self._current_reply(request_id)
        if reply is None:
            return
        del self._replies[reply.conversation_id]
        state = "stopped" if stats.get("finish_reason") == "cancelled" else "complete"
        stats = {**stats, **self._author_stats(reply)}
        reply.writer.finish(state, stats)
        if stats.get("dropped"):
            settings = self.store.conversation(reply.conversation_id).settings
            n_ctx = stats.get("n_ctx") or settings.n_ctx
            room = reply_room(n_ctx, settings.max_tokens)
            emit(self.notice, "warning", f"{stats['dropped']} older messages did not fit in the context of "
                                        f"{n_ctx:,} tokens, which keeps {room:,} for the reply, and were left out "
                                        "of this answer.")
        if stats.get("speculation_notice"):
            emit(self.notice, "warning", stats["speculation_notice"])
        self._after_reply(reply, stats)

    @Slot(int, str)
    def _on_error(self, request_id: int, message: str) -> None:
        reply = self._current_reply(request_id)
        if reply is None:
            return
        del self._replies[reply.conversation_id]
        reply.writer.finish("error", {"error": message, **self._author_stats(reply)})
        emit(self.notice, "error", message)
        self._after_reply(reply, {"error": message})

    def _author_stats(self, reply: _Reply) -> dict:
        """Which model wrote a reply, kept in its stats: its display name and file (no directory, for exports)."""
        path = reply.model[0]
        if is_remote_ref(path):  # the server's model id; never the endpoint's address or key (exports carry this)
            return {"model_name": self._display_name(path), "model_file": parse_remote_ref(path)[1]}
        return {"model_name": self._display_name(path), "model_file": path.replace("\\", "/").rsplit("/", 1)[-1]}

    def _display_name(self, path: str) -> str:
        if path == self.builtin_path:
            return BUILTIN_MODEL_NAME
        if is_remote_ref(path):
            return f"{parse_remote_ref(path)[1]} (remote)"
        if self.model_info.get("path") == path and self.model_info.get("name"):
            return self.model_info["name"]
        return display_name(None, path)

    @Slot()
    def _flush_replies(self) -> None:
        for reply in self._replies.values():
            reply.writer.flush_due(FLUSH_AGE_S)
        if not self._replies:
            self._flush_timer.stop()

    def _after_reply(self, reply: _Reply, stats: dict) -> None:
        emit(self.status, "Ready" if not self._replies else "Answering…")
        emit(self.reply_finished, reply.writer.message_id, stats)
        emit(self.conversations_changed)
        if reply.conversation_id == self.current_id:
            emit(self.messages_changed, reply.conversation_id)
            emit(self.generating_changed, False)
            self._emit_context_usage()

    @Slot(object)
    def _on_loaded(self, info: dict) -> None:
        if info.get("path") == self.builtin_path:
            info = {**info, "name": BUILTIN_MODEL_NAME}
        elif is_remote_ref(info.get("path")):
            info = {**info, "name": self._display_name(info["path"])}
        else:
            info = {**info, "name": display_name(info.get("name"), info.get("path"))}
        self.model_info = info
        emit(self.model_changed, info)
        emit(self.status, f"{info.get('name', 'Model')} is ready")
        self._emit_context_usage()
        for text in info.get("notices", []):
            emit(self.notice, "info", text)

    @Slot(str, str)
    def _on_load_failed(self, path: str, message: str) -> None:
        self.model_info = {}
        emit(self.model_changed, {})
        emit(self.status, "No model loaded")
        emit(self.notice, "error", f"Could not load {path.rsplit('/', 1)[-1]}: {message}")

    def _emit_context_usage(self) -> None:
        n_ctx = self.model_info.get("n_ctx") or self.settings().n_ctx
        used = 0
        for m in reversed(self.store.messages(self.current_id) if self.current_id else []):
            if m.role == "assistant" and "context_used" in m.stats:
                used = m.stats["context_used"]
                n_ctx = m.stats.get("n_ctx", n_ctx)
                break
        emit(self.context_usage, used, n_ctx, reply_room(n_ctx, self.settings().max_tokens))


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"
