"""The About box: name, version (engine.__version__, the one source of the version) and what runs here."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

import engine

from .theme import app_icon


def about_text(backend: str | None = None) -> str:
    """The About box's text; ``backend`` names the engine backend in use when a model is loaded."""
    lines = [f"<h3>Hearth {engine.__version__}</h3>",
             "<p>Chat with language models on this computer. Nothing you write leaves it.</p>",
             "<p>Reads GGUF models; runs them on MLX (Apple Silicon) or Hearth's own CPU engine.</p>"]
    if backend:
        lines.append(f"<p>Engine backend in use: {backend}</p>")
    return "".join(lines)


class AboutDialog(QMessageBox):
    """A non-blocking About box (opened with ``open()``).

    Signals:
        none of its own.
    """

    def __init__(self, backend: str | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("About Hearth")
        self.setIconPixmap(app_icon().pixmap(64, 64))
        self.setText(about_text(backend))
        self.setStandardButtons(QMessageBox.StandardButton.Close)
