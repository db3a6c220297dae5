"""One Hearth per user and data directory: a second launch asks the running one to come to the front, then exits.

A QLockFile in the data directory decides which process is the primary (Qt notices a lock left by a crashed
process from its PID). The primary listens on a QLocalServer named after the user and the data directory; a
later launch that finds the lock taken connects to that name, writes ``activate`` and waits for ``ok``.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import time
from pathlib import Path

from PySide6.QtCore import QDeadlineTimer, QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

LOCK_FILENAME = "hearth.lock"
ACTIVATE = b"activate"
ACK = b"ok"

log = logging.getLogger(__name__)


def server_name(data_dir: Path, user: str | None = None) -> str:
    """The local socket name for one user and one data directory (short enough for a Unix socket path)."""
    user = user or _user_name()
    digest = hashlib.sha256(f"{user}\0{Path(data_dir).resolve()}".encode()).hexdigest()[:16]
    safe_user = "".join(c for c in user if c.isalnum())[:16] or "user"
    return f"hearth-{safe_user}-{digest}"


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER: the uid still tells users apart
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


class SingleInstance(QObject):
    """Holds the per-data-directory lock and answers ``activate`` requests from later launches.

    Signals:
        activation_requested(): a later launch asked this one to show its window.
    """

    activation_requested = Signal()

    def __init__(self, data_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.name = server_name(data_dir)
        self._lock = QLockFile(str(Path(data_dir) / LOCK_FILENAME))
        self._lock.setStaleLockTime(0)  # held for the whole run: only a dead owner makes it stale
        self._server: QLocalServer | None = None

    @property
    def is_primary(self) -> bool:
        return self._lock.isLocked()

    def acquire(self) -> bool:
        """Become the primary instance: take the lock and listen. False when another process holds the lock."""
        if not self._lock.tryLock(0):
            return False
        # Holding the lock means any socket of that name was left behind by a crashed run.
        QLocalServer.removeServer(self.name)
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._on_new_connection)
        if not self._server.listen(self.name):
            log.warning("cannot listen for other launches (%s); they will not bring this window up",
                        self._server.errorString())
        return True

    def release(self) -> None:
        """Stop listening and drop the lock (at exit; Qt also drops it when the process ends)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._lock.isLocked():
            self._lock.unlock()

    def activate_running(self, timeout_s: float = 5.0) -> bool:
        """Ask the primary instance to show its window; True once it acknowledged.

        Retries until ``timeout_s`` because the primary may hold the lock a moment before it listens.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            if self._send_activate(remaining_ms):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _send_activate(self, timeout_ms: int) -> bool:
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        if not socket.waitForConnected(min(timeout_ms, 1000)):
            return False
        socket.write(ACTIVATE + b"\n")
        socket.flush()
        timer = QDeadlineTimer(timeout_ms)
        reply = b""
        while b"\n" not in reply and socket.waitForReadyRead(max(1, timer.remainingTime())):
            reply += bytes(socket.readAll())
        socket.disconnectFromServer()
        return reply.strip() == ACK

    def _on_new_connection(self) -> None:
        while self._server is not None and self._server.hasPendingConnections():
            socket = self._server.nextPendingConnection()
            socket.readyRead.connect(lambda s=socket: self._read_request(s))
            socket.disconnected.connect(socket.deleteLater)

    def _read_request(self, socket: QLocalSocket) -> None:
        if not socket.canReadLine():
            return
        request = bytes(socket.readLine()).strip()
        if request != ACTIVATE:
            log.warning("ignored an unknown request from another launch (%d bytes)", len(request))
            socket.disconnectFromServer()
            return
        socket.write(ACK + b"\n")
        socket.flush()
        log.info("another launch asked for the window")
        self.activation_requested.emit()


def bring_to_front(window: QWidget) -> None:
    """Show ``window`` un-minimized and ask the window manager to raise and focus it."""
    if window.isMinimized():
        window.showNormal()
    window.show()
    window.raise_()
    window.activateWindow()
