"""The Qt side of remote endpoints: adding (listing and probing) an endpoint off the GUI thread, reported back as
queued signals, so the window never waits on the network."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from .model_choices import ModelChoices
from .qt_compat import emit


class RemoteBridge(QObject):
    """Adds and refreshes remote endpoints on worker threads.

    Signals:
        added(str): the endpoint's address and how many models it lists, as a line for the Models page.
        failed(str): why the endpoint could not be added (unreachable, key refused, not a model list).
        refreshed(str): every endpoint was listed again; the text names those that could not be reached.
    """

    added = Signal(str)
    failed = Signal(str)
    refreshed = Signal(str)

    def __init__(self, choices: ModelChoices, parent: QObject | None = None):
        super().__init__(parent)
        self.choices = choices
        self.threads: list[threading.Thread] = []

    def add(self, base_url: str, api_key: str, headers_text: str, allow_self_signed: bool) -> None:
        """Start adding an endpoint; ``added`` or ``failed`` follows."""
        def run() -> None:
            try:
                endpoint = self.choices.add_remote(base_url, api_key, headers_text, allow_self_signed)
            except Exception as exc:  # noqa: BLE001 - ValueError (the form) and RemoteError (the server) say why
                emit(self.failed, f"Could not add {base_url}: {exc}")
                return
            emit(self.added, f"Added {endpoint.base_url}: {len(endpoint.models)} models. Select one and choose "
                             "“Use in this conversation”.")
        self._start(run, "hearth-remote-add")

    def refresh_all(self) -> None:
        """List and probe every endpoint again (one that came back loses its problem); ``refreshed`` follows."""
        remote = self.choices.remote

        def run() -> None:
            problems = []
            for endpoint in remote.list():
                try:
                    if remote.refresh(endpoint.id).problem:
                        problems.append(endpoint.base_url)
                except Exception as exc:  # noqa: BLE001 - removed meanwhile, or the list file is unwritable
                    problems.append(f"{endpoint.base_url} ({exc})")
            emit(self.refreshed, f"Could not reach {', '.join(problems)}." if problems else "")
        self._start(run, "hearth-remote-refresh")

    def _start(self, run, name: str) -> None:
        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()
