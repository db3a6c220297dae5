"""The Server page: the app's OpenAI- and Anthropic-compatible API server on or off, where it listens, its key,
allowed origins, and a live log of the requests it answered."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QFrame, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..api_server import RequestRecord, ServerSettings, new_api_key
from ..qt_compat import emit

LOG_ROWS = 200  # the most recent requests shown
COLUMNS = ("Time", "Endpoint", "Model", "Prompt", "Generated", "TTFT", "tok/s", "Status")


def record_cells(record: RequestRecord) -> list[str]:
    """A request log row as the table shows it."""
    answered = record.status == 200
    return [time.strftime("%H:%M:%S", time.localtime(record.finished_at)), record.endpoint, record.model or "—",
            f"{record.prompt_tokens:,}" + (f" ({record.cached_tokens:,} cached)" if record.cached_tokens else ""),
            f"{record.completion_tokens:,}" if answered else "—",
            f"{record.ttft_s * 1000:.0f} ms" if answered else "—",
            f"{record.tokens_per_second:.1f}" if answered else "—",
            f"{record.status} {record.finish_reason}" if answered else str(record.status)]


class ServerPage(QFrame):
    """Renders the server's settings, state and request log; emits the settings the user applies.

    Signals:
        apply_requested(ServerSettings): start, restart or stop the server with these settings.
    """

    apply_requested = Signal(object)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("serverPage")
        self._shown: ServerSettings | None = None  # the server's settings last put in the form
        self._build()

    def _build(self) -> None:
        title = QLabel("API server")
        title.setObjectName("pageTitle")
        note = QLabel("Serve the loaded model to editors, agents and scripts over OpenAI- and Anthropic-compatible "
                      "HTTP. Requests are answered beside your chats, in the same batches. Any address but "
                      "127.0.0.1 needs an API key.")
        note.setWordWrap(True)
        self.enabled = QCheckBox("Serve the API")
        self.address = QLineEdit()
        self.address.setPlaceholderText("127.0.0.1")
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none (only 127.0.0.1)")
        self.new_key = QPushButton("New key")
        self.new_key.clicked.connect(lambda: self.api_key.setText(new_api_key()))
        self.show_key = QCheckBox("Show")
        self.show_key.toggled.connect(lambda shown: self.api_key.setEchoMode(
            QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password))
        self.origins = QLineEdit()
        self.origins.setPlaceholderText("none: browsers on other sites are refused (CORS off)")
        self.apply_button = QPushButton("Apply")
        self.apply_button.clicked.connect(self._apply)
        self.base_url = QLineEdit()
        self.base_url.setReadOnly(True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(self.copy_base_url)
        self.status = QLabel()
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.log = QTableWidget(0, len(COLUMNS))
        self.log.setHorizontalHeaderLabels(COLUMNS)
        self.log.verticalHeader().setVisible(False)
        self.log.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.log.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.log.horizontalHeader().setStretchLastSection(True)
        self._lay_out(title, note)

    def _lay_out(self, title: QLabel, note: QLabel) -> None:
        key_row, url_row = QHBoxLayout(), QHBoxLayout()
        for widget in (self.api_key, self.show_key, self.new_key):
            key_row.addWidget(widget, 1 if widget is self.api_key else 0)
        for widget in (self.base_url, self.copy_button):
            url_row.addWidget(widget, 1 if widget is self.base_url else 0)
        form = QFormLayout()
        form.addRow("", self.enabled)
        form.addRow("Address", self.address)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow("Allowed origins", self.origins)
        form.addRow("", self.apply_button)
        form.addRow("Base URL", url_row)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(10)
        for widget in (title, note):
            layout.addWidget(widget)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(QLabel("Requests"))
        layout.addWidget(self.log, 1)

    # -- state in ----------------------------------------------------------------------------------
    def set_settings(self, settings: ServerSettings) -> None:
        """Show ``settings`` in the form."""
        self._shown = settings
        self.enabled.setChecked(settings.enabled)
        self.address.setText(settings.host)
        self.port.setValue(settings.port)
        self.api_key.setText(settings.api_key)
        self.origins.setText(", ".join(settings.allowed_origins))
        self.base_url.setText(settings.base_url)

    def set_state(self, state: dict) -> None:
        """Show whether the server runs, where, how many requests it is answering, or why it stopped; the form
        follows the server's settings when they changed (not on every report, which would undo an edit)."""
        settings = state.get("settings")
        if settings is not None and settings != self._shown:
            self.set_settings(settings)
        self.base_url.setText(state.get("base_url", ""))
        if state.get("error"):
            text = f"Not serving: {state['error']}"
        elif state.get("running"):
            active = state.get("active", 0)
            text = f"Serving at {state.get('base_url')} · {active} request{'' if active == 1 else 's'} running"
        else:
            text = "Not serving."
        self.status.setText(text)

    def add_record(self, record: RequestRecord) -> None:
        """Put an answered request at the top of the log."""
        self.log.insertRow(0)
        for column, text in enumerate(record_cells(record)):
            item = QTableWidgetItem(text)
            if column >= 3:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.log.setItem(0, column, item)
        while self.log.rowCount() > LOG_ROWS:
            self.log.removeRow(self.log.rowCount() - 1)

    # -- intents out --------------------------------------------------------------------------------
    def settings(self) -> ServerSettings:
        """The settings the form shows now."""
        origins = tuple(o.strip() for o in self.origins.text().split(",") if o.strip())
        return ServerSettings(enabled=self.enabled.isChecked(), host=self.address.text().strip() or "127.0.0.1",
                              port=self.port.value(), api_key=self.api_key.text().strip(), allowed_origins=origins)

    def _apply(self) -> None:
        emit(self.apply_requested, self.settings())

    def copy_base_url(self) -> None:
        QGuiApplication.clipboard().setText(self.base_url.text())
