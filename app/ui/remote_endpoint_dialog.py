"""The dialog that adds a remote endpoint: base URL, optional API key, extra headers and the self-signed switch."""

from __future__ import annotations

from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QPlainTextEdit,
                               QVBoxLayout, QWidget)


class RemoteEndpointDialog(QDialog):
    """Asks for an endpoint; ``values()`` after ``exec()`` returns what was typed.

    Signals:
        none (QDialog's accepted/rejected).
    """

    def __init__(self, keys_where: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add a remote endpoint")
        self.base_url = QLineEdit()
        self.base_url.setPlaceholderText("http://gpu-box:8000/v1")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)  # never on screen, nor in screenshots
        self.api_key.setPlaceholderText("optional")
        self.headers = QPlainTextEdit()
        self.headers.setPlaceholderText("optional, one per line: Name: value")
        self.headers.setFixedHeight(64)
        self.self_signed = QCheckBox("Allow a self-signed https certificate for this endpoint")
        note = QLabel(f"The key is kept in {keys_where}. Hearth lists the server's models (/v1/models) and asks each "
                      "for one token to learn what it supports.")
        note.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Base URL", self.base_url)
        form.addRow("API key", self.api_key)
        form.addRow("Extra headers", self.headers)
        form.addRow("", self.self_signed)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def values(self) -> tuple[str, str, str, bool]:
        """(base URL, API key, header lines, allow self-signed)."""
        return (self.base_url.text().strip(), self.api_key.text().strip(), self.headers.toPlainText(),
                self.self_signed.isChecked())
