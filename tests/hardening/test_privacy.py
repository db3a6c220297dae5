"""Nothing leaves the machine: a real chat opens no network connection, loads no telemetry, and logs no chat text.

The app runs as ``python -m app`` with the built-in model, driven by HEARTH_SCRIPT, under a guard that records
and refuses every socket connection, DNS lookup and datagram to anything but loopback. The guard proves itself
first (two refused attempts it makes on purpose), so an empty record means the app attempted nothing. A unique
marker sent as the chat message must then appear in no log file and no crash report, unless HEARTH_DEBUG is set.
"""

from __future__ import annotations

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before anything imports Qt

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import tomllib  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402
from PySide6.QtCore import QObject, Qt, QUrl, Slot  # noqa: E402
from PySide6.QtGui import QDesktopServices, QTextCursor  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QWidget  # noqa: E402

from app.paths import data_dir, log_dir  # noqa: E402
from app.store import DB_FILENAME, ConversationStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TELEMETRY_PACKAGES = {"sentry_sdk", "raven", "posthog", "mixpanel", "analytics", "segment", "amplitude",
                      "opentelemetry", "ddtrace", "datadog", "newrelic", "bugsnag", "rollbar", "honeybadger",
                      "logfire", "statsd", "prometheus_client", "google_analytics", "scarf"}
PROBE = "privacy-probe"

# argv: record file, modules file, marker, then the app's own arguments
GUARD = r"""
import errno, ipaddress, json, logging, socket, sys
RECORD, MODULES, MARKER = sys.argv[1:4]
del sys.argv[1:4]

def _local(address):
    host = address[0] if isinstance(address, tuple) else address
    host = host.decode() if isinstance(host, bytes) else host
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:  # a name other than localhost: resolving it is already network traffic
        return False

def _refuse(kind, address):
    with open(RECORD, "a") as f:
        f.write(json.dumps([kind, repr(address)]) + "\n")
    raise OSError(errno.ENETUNREACH, f"the privacy test refuses {kind} to {address!r}")

def _guarded(kind, original, address_of):
    def guarded(*args, **kwargs):
        address = address_of(*args, **kwargs)
        if not _local(address):
            _refuse(kind, address)
        return original(*args, **kwargs)
    return guarded

def _peer(self, address):
    return None if self.family == socket.AF_UNIX else address  # a path on this machine is local by definition

socket.socket.connect = _guarded("connect", socket.socket.connect, _peer)
socket.socket.connect_ex = _guarded("connect", socket.socket.connect_ex, _peer)
socket.socket.sendto = _guarded("sendto", socket.socket.sendto, lambda self, *args: _peer(self, args[-1]))
socket.create_connection = _guarded("create_connection", socket.create_connection, lambda address, *a, **k: address)
socket.getaddrinfo = _guarded("getaddrinfo", socket.getaddrinfo, lambda host, *a, **k: host)

for attempt in (lambda: socket.create_connection(("192.0.2.1", 443), timeout=1),  # the guard proves itself
                lambda: socket.getaddrinfo("huggingface.co", 443)):
    try:
        attempt()
    except OSError:
        pass

from PySide6.QtWidgets import QApplication
from app import scripted_session
from app.logging_setup import Private

def _next_then_quit(self, _next=scripted_session.ScriptedSession._next):
    last = not self.prompts
    _next(self)
    if last:  # every answer is in: log the marker as Private, as app code must, then quit like a person would
        logging.getLogger("hearth.privacy").info("privacy-probe %s", Private(MARKER))
        QApplication.instance().quit()

scripted_session.ScriptedSession._next = _next_then_quit

def _write_modules():
    with open(MODULES, "w") as f:
        json.dump(sorted(sys.modules), f)

import atexit, runpy
atexit.register(_write_modules)
sys.argv[0] = "hearth"
runpy.run_module("app", run_name="__main__")
"""


def inet_peers(pid: int, seen: set[str], stop: threading.Event) -> None:
    """Collect the remote addresses of the process's internet sockets (C code's too) until ``stop``."""
    process = psutil.Process(pid)
    while not stop.wait(0.05):
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            return
        seen.update(f"{c.raddr.ip}:{c.raddr.port}" for c in connections if c.raddr)


def chat_once(tmp_path: Path, marker: str, debug: bool, model: str | None = None) -> dict:
    """Run the app on a fresh data dir, send ``marker`` in a message, and return what happened."""
    data, record, modules = tmp_path / "data", tmp_path / "network.jsonl", tmp_path / "modules.json"
    script = {"prompts": [{"text": f"Please remember the code {marker}.", "max_tokens": 8, "temperature": 0.0}]}
    env = {k: v for k, v in os.environ.items() if k != "HEARTH_DEBUG"}
    env.update(HEARTH_SCRIPT=json.dumps(script), QT_QPA_PLATFORM="offscreen", **({"HEARTH_DEBUG": "1"} if debug else {}))
    args = ["--data-dir", str(data)] + (["--model", model] if model else [])
    proc = subprocess.Popen([sys.executable, "-c", GUARD, str(record), str(modules), marker, *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peers, stop = set(), threading.Event()
    watcher = threading.Thread(target=inet_peers, args=(proc.pid, peers, stop), daemon=True)
    watcher.start()
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
        stop.set()
        watcher.join()
    assert proc.returncode == 0, stderr[-3000:]
    events = [json.loads(line) for line in stdout.splitlines()]
    attempts = [json.loads(line) for line in record.read_text().splitlines()]
    logs = {p.name: p.read_text(encoding="utf-8", errors="replace") for p in (data / "logs").iterdir() if p.is_file()}
    return {"data": data, "events": events, "attempts": attempts, "peers": peers, "stderr": stderr, "logs": logs,
            "modules": json.loads(modules.read_text())}


@pytest.mark.slow
def test_a_chat_with_the_built_in_model_stays_on_this_machine_and_out_of_the_logs(tmp_path):
    marker = f"hearth-privacy-{uuid.uuid4().hex}"
    run = chat_once(tmp_path, marker, debug=False)
    # the guard refused the two attempts it made itself, and the app attempted nothing
    assert run["attempts"] == [["create_connection", "('192.0.2.1', 443)"], ["getaddrinfo", "'huggingface.co'"]]
    assert {peer for peer in run["peers"] if not peer.startswith(("127.", "::1"))} == set()
    assert {name.split(".")[0] for name in run["modules"]} & TELEMETRY_PACKAGES == set()
    # the message really went through the app: it was answered and saved
    (finished,) = [e for e in run["events"] if e["event"] == "finished"]
    assert finished["stats"]["generated_tokens"] > 0
    store = ConversationStore(run["data"] / DB_FILENAME)
    try:
        assert any(marker in m.content for c in store.conversations() for m in store.messages(c.id))
    finally:
        store.close()
    # the live log file was written (the probe, redacted) and holds neither the message nor the answer
    assert f"{PROBE} <private: {len(marker)} chars>" in run["logs"]["hearth.log"]
    answer = finished["content"].strip()
    for name, text in run["logs"].items():
        assert marker not in text, f"the chat message is in {name}"
        assert len(answer) < 12 or answer not in text, f"the answer is in {name}"
    assert marker not in run["stderr"]


@pytest.mark.slow
def test_with_hearth_debug_the_same_search_finds_private_text(tmp_path):
    """Control: with HEARTH_DEBUG=1 text wrapped in Private is logged, and the search above would have seen it."""
    marker = f"hearth-privacy-{uuid.uuid4().hex}"
    from tests.engine.gguf_builders import write_tiny_llama

    run = chat_once(tmp_path, marker, debug=True, model=str(write_tiny_llama(tmp_path / "tiny.gguf")))
    assert f"{PROBE} {marker}" in run["logs"]["hearth.log"]
    assert run["attempts"][2:] == []


def test_no_telemetry_package_is_a_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    names = {r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("!")[0].strip()
             .lower().replace("-", "_") for r in requirements}
    assert names & TELEMETRY_PACKAGES == set()
    assert "numpy" in names and "huggingface_hub" in names  # the names were parsed


def test_the_data_and_log_folders_hearth_creates_are_private_to_the_user(tmp_path):
    data = data_dir(tmp_path / "new" / "Hearth")
    logs = log_dir(data)
    for folder in (data, logs):
        assert folder.stat().st_mode & 0o077 == 0, f"{folder} is readable by other users"


# -- links in an answer --------------------------------------------------------------------------------------
LINKS = {"webpage": "https://example.org/page", "plain": "http://example.org/", "mail": "mailto:a@example.org",
         "editor": "vscode://file/home/user/.bashrc", "share": "smb://192.0.2.1/share", "helper": "ms-msdt:PCW",
         "local": "file:///etc/hostname"}


class LinkRecorder(QObject):
    """Stands in for the desktop's URL handlers and records what it is asked to open."""

    def __init__(self):
        super().__init__()
        self.opened: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.opened.append(url.toString())


def click_word(block, word: str) -> None:
    cursor = QTextCursor(block.document())
    cursor.setPosition(block.document().find(word).selectionStart() + 2)
    QTest.mouseClick(block.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     block.cursorRect(cursor).center())


@pytest.mark.gui
def test_links_in_an_answer_open_only_web_and_mail_addresses(qtbot):
    """An answer's text is the model's: a click must not start another program through a URL scheme, nor turn the
    bubble into a viewer of a local file."""
    from app.ui.markdown_view import ProseBlock

    recorder = LinkRecorder()
    schemes = {QUrl(url).scheme() for url in LINKS.values()}
    for scheme in schemes:
        QDesktopServices.setUrlHandler(scheme, recorder, "open")
    try:
        window = QWidget()  # the block sizes itself to its text, which a top-level window would have to follow
        qtbot.addWidget(window)
        block = ProseBlock(window)
        block.resize(700, 300)
        window.resize(720, 600)
        window.show()
        block.set_markdown("\n\n".join(f"[{word}]({url})" for word, url in LINKS.items()))
        for word in LINKS:
            click_word(block, word)
    finally:
        for scheme in schemes:
            QDesktopServices.unsetUrlHandler(scheme)
    assert recorder.opened == [LINKS["webpage"], LINKS["plain"], LINKS["mail"]]
    assert block.toPlainText().split() == list(LINKS)  # still the answer, not the file behind "local"
