"""``--smoke-test OUTDIR``: chat once with the real window and model, screenshot every page, write a transcript.

Then the labels: a conversation where two models answered (the second reply a stored sample whose stats name
another model; ``chat-two-models*.png``), the Models page's inline error for a file that is not a model
(``models-add-error*.png``), the Default settings page (``defaults*.png``), and a copy of the built-in model
without its chat template opened as a base model (``chat-base-model*.png``).

The built-in model does not think, so the Thinking block is shown on a stored sample: a reply written the way
Qwen3 writes one (``<think>…</think>`` then the answer), fed through the app's own reply writer and reasoning
splitter, tokenized by the built-in model's tokenizer for its token count, and opened in the real window
(``chat-thinking*.png``; the transcript's ``thinking_sample`` says so).

Then the Server page while the app's API server answers a few streaming requests from clients on threads of
this process, in the app's own engine (``server-streaming*.png``; the transcript's ``server`` has the request log).

Then the chat polish, on stored sample answers too: a question with three answers (as Regenerate keeps them),
the second shown with its Python code block in syntax colours and ‹ 2/3 › (``chat-code.png``, ``chat-code-dark.png``),
and the window at 760×520 with the settings open (``chat-narrow.png``, ``chat-narrow-dark.png``).

Last, a remote model (``app/smoke_remote.py``): the built-in model behind an in-process ``hearth serve`` on
loopback, answering as a remote endpoint's model (``chat-remote*.png``, ``dashboard-remote.png``,
``models-remote.png``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from engine.gguf_file import read_gguf
from engine.reasoning import THINK, ReasoningSplitter, count_thinking_tokens
from engine.tokenizer import IncrementalDecoder, Tokenizer

from .app_session import AppSession
from .qt_compat import emit
from .smoke_remote import RemoteStage
from .ui.theme import dark_palette

PROMPT = "Hello! Who are you?"
DASHBOARD_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
DASHBOARD_AFTER_S = 2  # of decoding (or DASHBOARD_AFTER_TOKENS) before dashboard.png, so its charts show an answer
DASHBOARD_AFTER_TOKENS = 100
# The story's length is the model's choice, not ours: greedy with the app's repeat penalty it ran past 1500 tokens
# until a kernel change moved its rounding, and then ended at 292 tokens (2026-11-26). An engine sample arrives every
# 0.5 s, so one past 100 tokens comes while any answer of 200+ tokens streams at under 200 tok/s (the built-in model
# decodes 50-65 tok/s on the CPU backend here); the answer is stopped once the screenshot is taken.
DASHBOARD_MAX_TOKENS = 1500
TIMEOUT_S = 600
SERVER_CLIENTS = 4  # streaming API requests running while the Server page is grabbed
SERVER_MAX_TOKENS = 96
THINKING_PROMPT = "Is 97 a prime number?"
THINKING_REPLY = (  # as a thinking model (Qwen3, SmolLM3) writes it; a sample, not generated here
    "<think>\nThe user asks whether 97 is prime. The square root of 97 is a little under 10, so I only need to "
    "try 2, 3, 5 and 7.\n97 is odd; 9 + 7 = 16 is not a multiple of 3; it does not end in 0 or 5; "
    "7 × 13 = 91 and 7 × 14 = 98.\nNo divisor, so 97 is prime.\n</think>\n\n"
    "Yes — **97 is a prime number**. It is not divisible by 2, 3, 5 or 7, and those are the only primes up to "
    "√97 ≈ 9.8, so it has no divisors other than 1 and itself.")
TWO_MODELS_PROMPT = "And in one sentence?"
TWO_MODELS_REPLY = "I am a small language model running on this computer."  # a sample, not generated here
TWO_MODELS_STATS = {"model": "Smollm2 135M 8k Lc100K Mix1 Ep2", "model_name": "SmolLM2 135M Instruct",
                    "model_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "generated_tokens": 12, "prefill_s": 0.02,
                    "decode_tps": 180.0, "finish_reason": "eos"}


def write_without_chat_template(source: Path, target: Path) -> None:
    """Copy a GGUF without its chat template (as a base model ships), through the gguf package's own copier."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
        copy_with_new_metadata(reader, writer, {}, [gguf.Keys.Tokenizer.CHAT_TEMPLATE])
CODE_PROMPT = "Write a Python function that tells whether a number is prime."
CODE_REPLIES = (  # three answers to one question, as Regenerate keeps them; samples, not generated here
    "Check every divisor up to the square root of the number.",
    "Here is a short one:\n\n```python\ndef is_prime(n: int) -> bool:\n    \"\"\"True when n is a prime number.\"\"\"\n"
    "    if n < 2:\n        return False\n    # a divisor above the square root pairs with one below it\n"
    "    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n\n\nprint([n for n in range(30) if is_prime(n)])\n"
    "```\n\nIt tries each divisor from 2 up to √n.",
    "Use `sympy.isprime(n)` if SymPy is installed.")
NARROW_SIZE = (760, 520)


class SmokeTest(QObject):
    """Drives an AppSession: sends PROMPT, waits for the streamed answer, saves PNGs and transcript.json, quits.

    Signals:
        none; ``exit_code`` holds the result once the event loop has ended.
    """

    def __init__(self, session: AppSession, out_dir: Path):
        super().__init__()
        self.session = session
        self.out = out_dir
        self.out.mkdir(parents=True, exist_ok=True)
        self.exit_code = 1
        self.chunks = 0
        self.pages: dict[str, str] = {}  # screenshot name -> file
        self.sent_at = self.first_text_at = None
        self.transcript: dict | None = None  # set once the first answer is captured; then the dashboard's turn
        self._remote: RemoteStage | None = None  # the last stage, once it has begun
        self._deadline = QTimer(self, singleShot=True, interval=TIMEOUT_S * 1000)
        self._deadline.timeout.connect(lambda: self._fail(f"no answer within {TIMEOUT_S} s"))

    def start(self) -> None:
        c = self.session.controller
        c.reply_text.connect(self._on_text)
        c.reply_finished.connect(self._on_finished)
        self.session.window.resize(1180, 760)
        conv = c.new_conversation()
        settings = dataclasses.replace(c.settings(), temperature=0.0, seed=0, max_tokens=160)
        c.update_settings(settings)
        c.open_conversation(conv)
        self._deadline.start()
        self.started_at = time.perf_counter()
        self.loaded_at = None
        if c.model_info:
            QTimer.singleShot(0, self._send)
        else:  # measure time to first token on a loaded model, as a user who waits for "ready" sees it
            c.model_changed.connect(self._on_model)

    def _on_model(self, info: dict) -> None:
        if not info:
            self._fail("the built-in model did not load")
        elif self.loaded_at is None:
            self.loaded_at = time.perf_counter()
            QTimer.singleShot(0, self._send)

    def _send(self) -> None:
        self.pages["chat-empty"] = self._grab("chat-empty")
        self.sent_at = time.perf_counter()
        self.session.window.composer.edit.setPlainText(PROMPT)
        self.session.window.composer.button.click()

    def _on_text(self, _message_id: int, _text: str) -> None:
        self.chunks += 1
        if self.first_text_at is None:
            self.first_text_at = time.perf_counter()
        if self.chunks == 4:
            self.pages["chat-streaming"] = self._grab("chat-streaming")

    def _on_finished(self, message_id: int, stats: dict) -> None:
        if self._remote is not None:  # the remote stage's answer: that stage follows it
            return
        if self.transcript is not None:
            self._finish_dashboard(stats)
            return
        if "error" in stats:
            self._fail(stats["error"])
            return
        QTimer.singleShot(300, lambda: self._capture(message_id, stats))

    def _capture(self, message_id: int, stats: dict) -> None:
        window = self.session.window
        self.first_reply_id = message_id
        reply = self.session.store.message(message_id).content
        if not reply.strip():
            self._fail("the model answered with empty text")
            return
        pages = self.pages
        for name in (name for name in window.pages if name != "dashboard"):  # that one while an answer streams
            window.show_page(name)
            pages[name] = self._grab(name)
        window.show_page("chat")
        window.settings_button.setChecked(True)
        pages["chat-settings"] = self._grab("chat-settings")
        window.settings_button.setChecked(False)
        pages["chat-dark"] = self._grab_dark("chat-dark")
        self.transcript = {
            "prompt": PROMPT, "reply": reply, "stats": stats, "model": self.session.controller.model_info,
            "load_s": round(self.loaded_at - self.started_at, 3) if self.loaded_at else None,
            "ui_time_to_first_text_s": round(self.first_text_at - self.sent_at, 3) if self.first_text_at else None,
            "ui_text_updates": self.chunks, "screenshots": pages,
        }
        c = self.session.controller
        c.update_settings(dataclasses.replace(c.settings(), max_tokens=DASHBOARD_MAX_TOKENS))
        window.show_page("dashboard")
        self.session.telemetry.engine_sampled.connect(self._on_engine_sample)
        c.send(DASHBOARD_PROMPT)

    def _on_engine_sample(self, sample) -> None:
        streamed = sample.phase == "decode" and (sample.decode_s >= DASHBOARD_AFTER_S
                                                 or sample.generated_tokens >= DASHBOARD_AFTER_TOKENS)
        if streamed and "dashboard" not in self.pages:
            self._grab_dashboard()

    def _grab_dashboard(self) -> None:
        telemetry = self.session.telemetry
        self.transcript["dashboard"] = {"decode_tps": round(telemetry.decode_tps(), 2),  # as the screenshot shows it
                                        "generated_tokens": telemetry.engine.generated_tokens,
                                        "system_samples": telemetry.samples_taken}
        self.pages["dashboard"] = self._grab("dashboard")
        self.pages["dashboard-dark"] = self._grab_dark("dashboard-dark")
        self.session.controller.stop()

    def _finish_dashboard(self, stats: dict) -> None:
        if "dashboard" not in self.pages:
            self._fail(f"the dashboard's answer ended before its screenshot: {stats}")
            return
        QTimer.singleShot(300, self._capture_thinking)

    def _capture_thinking(self) -> None:
        """Open the stored thinking sample; its screenshots follow once the previous conversation's widgets are gone."""
        message = self._store_thinking_sample()
        self.session.window.show_page("chat")
        QTimer.singleShot(300, lambda: self._grab_thinking(message))

    def _grab_thinking(self, message) -> None:
        """The thinking sample folded, folded in dark, and opened; then the transcript."""
        widget = self.session.window.chat_view.widgets.get(message.id)
        if widget is None or widget.thinking.isHidden() or widget.thinking.is_open():
            self._fail("the thinking sample did not show as a folded Thinking block")
            return
        self.pages["chat-thinking"] = self._grab("chat-thinking")
        self.pages["chat-thinking-dark"] = self._grab_dark("chat-thinking-dark")
        widget.thinking.header.click()
        self.pages["chat-thinking-open"] = self._grab("chat-thinking-open")
        self.transcript["thinking_sample"] = {
            "note": "a stored sample reply (the built-in model does not think), split by the app's reply writer",
            "prompt": THINKING_PROMPT, "thinking": message.thinking, "answer": message.content,
            "stats": message.stats}
        self._capture_labels()

    def _capture_labels(self) -> None:
        """Replies labelled by model, the Models page's inline error, the defaults page; then the base model."""
        self.transcript["two_models"] = self._store_two_model_chat()
        QTimer.singleShot(300, self._grab_labels)  # once the previous conversation's widgets are gone

    def _grab_labels(self) -> None:
        window, pages = self.session.window, self.pages
        self.transcript["two_models"]["authors"] = [w._author.text() for w in window.chat_view.widgets.values()]
        pages["chat-two-models"] = self._grab("chat-two-models")
        pages["chat-two-models-dark"] = self._grab_dark("chat-two-models-dark")
        broken = self.out / "not-a-model.gguf"
        broken.write_bytes(b"This file is not a GGUF model.\n")
        window.show_page("models")
        emit(window.models_page.add_requested, str(broken))
        pages["models-add-error"] = self._grab("models-add-error")
        pages["models-add-error-dark"] = self._grab_dark("models-add-error-dark")
        window.show_page("defaults")
        pages["defaults-dark"] = self._grab_dark("defaults-dark")
        self._capture_server()

    def _capture_server(self) -> None:
        """The Server page while API requests stream: one short request first (a row in the log), then
        ``SERVER_CLIENTS`` streaming ones, grabbed once they all run."""
        from engine.serve.library import model_id
        from .api_server import ServerSettings

        server = self.session.api_server
        server.apply(ServerSettings(enabled=True, port=_free_port()))
        if not server.running:
            self._fail(f"the API server did not start: {server.error}")
            return
        self.session.window.show_page("server")
        name = model_id(self.session.controller.model_info["path"])
        self._api_replies: list[str] = []
        ask = lambda stream: self._api_replies.append(_ask_api(server.settings.base_url, name, stream))  # noqa: E731
        threading.Thread(target=ask, args=(False,), daemon=True).start()
        self._server_polls, self._streams_started = 0, False
        self._server_timer = QTimer(self, interval=100)
        self._server_timer.timeout.connect(lambda: self._poll_server(ask))
        self._server_timer.start()

    def _poll_server(self, ask) -> None:
        served, self._server_polls = self.session.api_server.served, self._server_polls + 1
        if self._server_polls > 10 * TIMEOUT_S // 2:
            self._server_timer.stop()
            self._fail("the API server's requests did not run")
        elif served.stats.log and not self._streams_started:
            self._streams_started = True
            for _ in range(SERVER_CLIENTS):
                threading.Thread(target=ask, args=(True,), daemon=True).start()
        elif self._streams_started and served.active >= SERVER_CLIENTS \
                and self.session.host.model.scheduler.has_work and len(self._api_replies) == 1 \
                and self.session.telemetry.engine.phase == "decode":
            self._server_timer.stop()
            self.session.api_server.report()
            self.pages["server-streaming"] = self._grab("server-streaming")
            self.pages["server-streaming-dark"] = self._grab_dark("server-streaming-dark")
            self.transcript["server"] = {"running": served.active, "log": [
                {"endpoint": r.endpoint, "status": r.status, "completion_tokens": r.completion_tokens}
                for r in served.stats.log]}
            self.session.api_server.stop()
            self.session.window.show_page("chat")
            self._capture_polish()  # before the base model, so the samples are shown under the built-in model

    def _store_two_model_chat(self) -> dict:
        """The first real answer (the built-in model's) and a stored sample answer recorded as another model's."""
        c, store = self.session.controller, self.session.store
        first = store.message(self.first_reply_id)
        conv = c.new_conversation()
        c.rename(conv, "Two models (second reply: a sample)")
        store.add_message(conv, "user", PROMPT)
        store.add_message(conv, "assistant", first.content, stats=first.stats)
        store.add_message(conv, "user", TWO_MODELS_PROMPT)
        store.add_message(conv, "assistant", TWO_MODELS_REPLY, stats=TWO_MODELS_STATS)
        c.open_conversation(conv)
        return {"note": "the first reply is the built-in model's real answer above; the second is a stored sample "
                        "whose stats name another model"}

    def _open_base_model(self) -> None:
        """A copy of the built-in model without its chat template, in a new conversation, before its first message."""
        c = self.session.controller
        base = Path(tempfile.mkdtemp(prefix="hearth-smoke-")) / "builtin-no-template.gguf"
        write_without_chat_template(Path(c.builtin_path), base)
        self._scratch = base
        c.new_conversation()
        c.model_changed.connect(self._on_base_model)
        c.set_model(str(base))

    def _on_base_model(self, info: dict) -> None:
        c = self.session.controller
        c.model_changed.disconnect(self._on_base_model)
        if not info:
            self._fail("the copy of the built-in model without a chat template did not load")
            return
        self.pages["chat-base-model"] = self._grab("chat-base-model")
        self.pages["chat-base-model-dark"] = self._grab_dark("chat-base-model-dark")
        self.transcript["base_model"] = {"model_text": self.session.window.composer.model_label.text()}
        with contextlib.suppress(OSError):  # (a file still mapped cannot be deleted on Windows: the OS's temp dir)
            self._scratch.unlink()
            self._scratch.parent.rmdir()
        self._remote = RemoteStage(self.session, self._grab, self._grab_dark, self._remote_done, self._fail)
        self._remote.start()

    def _remote_done(self, part: dict) -> None:
        self.pages.update(part.pop("screenshots"))
        self.transcript["remote"] = part
        (self.out / "transcript.json").write_text(json.dumps(self.transcript, indent=2, ensure_ascii=False))
        self.exit_code = 0
        QApplication.instance().quit()

    def _capture_polish(self) -> None:
        """Stored code answers with alternatives, then the narrow window."""
        shown = self._store_code_sample()
        QTimer.singleShot(300, lambda: self._grab_polish(shown))

    def _store_code_sample(self):
        """A question with three stored answers (the first two kept as Regenerate keeps them), the second shown."""
        c, store = self.session.controller, self.session.store
        conv = c.new_conversation()
        c.rename(conv, "Code and alternatives (sample replies)")
        question = store.add_message(conv, "user", CODE_PROMPT)
        answers = []
        for reply in CODE_REPLIES:
            store.keep_answers_as_alternatives(conv, question.id)
            answers.append(store.add_message(conv, "assistant", reply, reply_to=question.id))
        store.show_alternative(answers[1].id)
        c.open_conversation(conv)
        return store.message(answers[1].id)

    def _grab_polish(self, shown) -> None:
        """The code block in colour with ‹ 2/3 ›, light and dark; the narrow window with the settings open."""
        window = self.session.window
        widget = window.chat_view.widgets.get(shown.id)
        if widget is None or not widget.body.code_blocks() or widget.alternatives_label.text() != "2/3":
            self._fail("the code sample did not show a code block with its alternatives 2/3")
            return
        self.pages["chat-code"] = self._grab("chat-code")
        self.pages["chat-code-dark"] = self._grab_dark("chat-code-dark")
        size = window.size()
        window.resize(*NARROW_SIZE)
        window.settings_button.setChecked(True)
        self.pages["chat-narrow"] = self._grab("chat-narrow")
        self.pages["chat-narrow-dark"] = self._grab_dark("chat-narrow-dark")
        narrow_sidebar = window.sidebar.isVisible()
        window.settings_button.setChecked(False)
        window.resize(size)
        self.transcript["polish_sample"] = {
            "note": "stored sample answers (not generated): a question with three, the second shown",
            "prompt": CODE_PROMPT, "answers": list(CODE_REPLIES), "shown": 2,
            "narrow_window": list(NARROW_SIZE), "narrow_sidebar_visible": narrow_sidebar}
        self._open_base_model()

    def _store_thinking_sample(self):
        c, store = self.session.controller, self.session.store
        conv = c.new_conversation()
        c.rename(conv, "Thinking (sample reply)")
        store.add_message(conv, "user", THINKING_PROMPT)
        tokenizer = Tokenizer.from_gguf(read_gguf(c.builtin_path))
        decoder = IncrementalDecoder(tokenizer, skip_special=True)
        pieces = [decoder.add(t) for t in tokenizer.encode(THINKING_REPLY, add_special=False)] + [decoder.flush()]
        writer = store.begin_reply(conv, splitter=ReasoningSplitter(THINK))
        for piece in pieces:
            writer.append(piece)
        writer.finish("complete", {"generated_tokens": len(pieces) - 1,
                                   "thinking_tokens": count_thinking_tokens(pieces, THINK)})
        c.open_conversation(conv)
        return store.message(writer.message_id)

    def _grab_dark(self, name: str) -> str:
        app = QApplication.instance()
        old_palette, old_style = app.palette(), app.style().name()
        app.setStyle("Fusion")
        app.setPalette(dark_palette())
        try:
            return self._grab(name)
        finally:
            app.setPalette(old_palette)
            app.setStyle(old_style)

    def _grab(self, name: str) -> str:
        app = QApplication.instance()
        for _ in range(5):
            app.processEvents()
        path = self.out / f"{name}.png"
        if not self.session.window.grab().save(str(path)):
            raise OSError(f"could not save {path}")
        return path.name

    def _fail(self, message: str) -> None:
        print(f"smoke test failed: {message}", file=sys.stderr)
        self.exit_code = 1
        QApplication.instance().quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask_api(base_url: str, model: str, stream: bool) -> str:
    """One chat completion from the app's API server, read to its end; the raw body (or why it failed)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
                       "max_tokens": SERVER_MAX_TOKENS if stream else 8, "temperature": 0, "stream": stream}).encode()
    request = urllib.request.Request(f"{base_url}/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.read().decode()
    except (OSError, http.client.HTTPException) as e:  # the server stopped after the screenshot: the stream ends
        return f"error: {e}"
