"""A small progress dialog shown while the built-in model is assembled on first start."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressDialog, QWidget


class BuiltinProgressDialog(QProgressDialog):
    """Shows how much of the built-in model has been written; the window behind it stays usable.

    Signals:
        none of its own (QProgressDialog's).
    """

    def __init__(self, model_name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Preparing the built-in model")
        self.setLabelText(f"Preparing {model_name} for its first use…")
        self.setCancelButton(None)  # it takes seconds; closing the window stops it
        self.setRange(0, 1000)
        self.setMinimumDuration(0)
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.setWindowModality(Qt.WindowModality.NonModal)
        self.setValue(0)

    def show_progress(self, done: int, total: int) -> None:
        """Move the bar to ``done`` of ``total`` bytes and say it in MB."""
        self.setValue(min(1000, done * 1000 // max(total, 1)))
        self.setLabelText(f"{self.labelText().split(chr(10))[0]}\n{done / 1e6:,.0f} of {total / 1e6:,.0f} MB")
