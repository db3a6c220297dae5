"""The dashboard's card for a remote model: its endpoint, requests in flight, errors and latency as seen from here
(it stands where the local memory and thermal charts stand when the model runs on this computer)."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from engine.remote import RemoteStats

from .charts import ChartCard


class RemoteCard(ChartCard):
    """Shows a remote endpoint's figures from the engine's samples.

    Signals:
        none.
    """

    def __init__(self, parent: QWidget | None = None):
        self.body = QLabel("No remote model in use.")
        self.body.setObjectName("remoteFigures")
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setWordWrap(True)
        self.body.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        super().__init__("Remote server", self.body, parent)
        self.legend.hide()
        self.endpoint = ""

    def set_endpoint(self, endpoint: str, model_id: str) -> None:
        self.endpoint = f"{model_id} at {endpoint}"
        self.show_stats(None)

    def show_stats(self, stats: RemoteStats | None) -> None:
        """The figures of ``stats`` (None: nothing asked yet)."""
        lines = [f"<b>{escape(self.endpoint)}</b>"]
        if stats is None:
            lines.append("No request yet.")
        else:
            lines += [f"Requests in flight: {stats.in_flight}",
                      f"Requests: {stats.requests} · errors: {stats.errors}",
                      f"Time to first token: {seconds(stats.last_ttft_s)} last, {seconds(stats.mean_ttft_s)} mean",
                      f"Reply speed (last): {rate(stats.last_tokens_per_second)}"]
            if stats.last_error:
                lines.append(f"<i>Last error: {escape(stats.last_error)}</i>")
        self.body.setText("<br>".join(lines))


def seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} tok/s"
