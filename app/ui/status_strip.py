"""The status strip: decode speed, memory, thermal state, backend and model, always visible in the status bar."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from ..qt_compat import emit
from ..telemetry import EngineSample, SystemSample, Telemetry, format_bytes
from .charts import COLORS, legend_html

THERMAL_COLORS = {"nominal": COLORS["available"], "fair": "#d9a520", "serious": COLORS["hearth"],
                  "critical": COLORS["thermal"], "unknown": COLORS["other"]}


class StatusStrip(QWidget):
    """A line of small readings; clicking it asks for the dashboard. Asks Telemetry for (slow) samples while shown.

    Signals:
        activated(): the user clicked the strip.
    """

    activated = Signal()

    def __init__(self, telemetry: Telemetry, parent: QWidget | None = None):
        super().__init__(parent)
        self.telemetry = telemetry
        self.setObjectName("statusStrip")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Open the dashboard")
        self.speed, self.memory, self.thermal, self.model = QLabel(), QLabel(), QLabel(), QLabel()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 6, 0)
        layout.setSpacing(14)
        for label in (self.speed, self.memory, self.thermal, self.model):
            label.setObjectName("stripItem")
            label.setTextFormat(Qt.TextFormat.RichText)
            layout.addWidget(label)
        self.model.setText("no model")
        telemetry.system_sampled.connect(self.show_system)
        telemetry.engine_sampled.connect(self.show_engine)
        self.show_engine(telemetry.engine)

    def set_model(self, info: dict) -> None:
        """The loaded model's info (name, backend), or {} when none is loaded."""
        text = f"{info.get('backend') or '?'} · {info.get('name', 'model')}" if info else "no model"
        self.model.setText(text)

    def show_system(self, s: SystemSample) -> None:
        self.memory.setText(f"Hearth {format_bytes(s.rss_bytes)} · {format_bytes(s.available_bytes)} of "
                            f"{format_bytes(s.total_bytes)} free")
        state = s.thermal.value
        self.thermal.setText(f"<span style='color:{THERMAL_COLORS[state]}'>●</span>&nbsp;thermal {state}")
        self.thermal.setToolTip(f"Thermal state from {s.thermal_source}")

    def show_engine(self, e: EngineSample) -> None:
        if e.phase == "decode":
            text = f"{self.telemetry.decode_tps():.1f} tok/s"
        elif e.phase == "prefill":
            text = "reading prompt"
        else:
            text = "idle" if e.phase == "idle" else "–"
        self.speed.setText(legend_html([("decode", text)]))

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self.telemetry.watch("status strip", True)

    def hideEvent(self, event) -> None:  # noqa: N802
        self.telemetry.watch("status strip", False)
        super().hideEvent(event)

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            emit(self.activated)
        super().mousePressEvent(event)
