"""The status strip: decode speed, memory, thermal state, backend and model, always visible in the status bar."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from ..qt_compat import emit
from ..telemetry import EngineSample, SystemSample, Telemetry, format_bytes
from .charts import COLORS, legend_html

MESSAGE_ROOM_PX = 280  # the status bar's own messages ("Answering…  (Esc to stop)") keep at least this much
THERMAL_COLORS = {"nominal": COLORS["available"], "fair": "#d9a520", "serious": COLORS["hearth"],
                  "critical": COLORS["thermal"], "unknown": COLORS["other"]}


class StatusStrip(QWidget):
    """A line of small readings; clicking it asks for the dashboard. Asks Telemetry for (slow) samples while shown.

    When the window is narrow, the readings that do not fit are left out from the end (model, then thermal state).

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
        self.items = (self.speed, self.memory, self.thermal, self.model)  # most important first
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 6, 0)
        layout.setSpacing(14)
        for label in self.items:
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
        self._set(self.model, text)

    def show_system(self, s: SystemSample) -> None:
        self._set(self.memory, f"Hearth {format_bytes(s.rss_bytes)} · {format_bytes(s.available_bytes)} of "
                               f"{format_bytes(s.total_bytes)} free")
        state = s.thermal.value
        self._set(self.thermal, f"<span style='color:{THERMAL_COLORS[state]}'>●</span>&nbsp;thermal {state}")
        self.thermal.setToolTip(f"Thermal state from {s.thermal_source}")

    def show_engine(self, e: EngineSample) -> None:
        if e.phase == "decode":
            text = f"{self.telemetry.decode_tps():.1f} tok/s"
        elif e.phase == "prefill":
            text = "reading prompt"
        else:
            text = "idle" if e.phase == "idle" else "–"
        self._set(self.speed, legend_html([("decode", text)]))

    # -- fitting the width the status bar gives ------------------------------------------------------------
    def _set(self, label: QLabel, text: str) -> None:
        if text != label.text():
            label.setText(text)
            self.updateGeometry()
            self._fit(self.width())

    def sizeHint(self) -> QSize:  # noqa: N802
        """Room for every reading, but no more than leaves the status bar's messages their room."""
        layout = self.layout()
        margins = layout.contentsMargins()
        width = sum(label.sizeHint().width() for label in self.items) + layout.spacing() * (len(self.items) - 1)
        width += margins.left() + margins.right()
        top = self.window()
        if top is not self:
            width = min(width, max(self._least_width(), top.width() - MESSAGE_ROOM_PX))
        return QSize(width, self._height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self._least_width(), self._height())

    def _least_width(self) -> int:
        margins = self.layout().contentsMargins()
        return self.speed.sizeHint().width() + margins.left() + margins.right()

    def _height(self) -> int:
        return max(label.sizeHint().height() for label in self.items)

    def _fit(self, width: int) -> None:
        layout = self.layout()
        margins = layout.contentsMargins()
        used, fits = margins.left() + margins.right(), True
        for i, label in enumerate(self.items):
            used += label.sizeHint().width() + (layout.spacing() if i else 0)
            fits = fits and used <= width
            label.setVisible(fits)

    def resizeEvent(self, event) -> None:  # noqa: N802
        self._fit(event.size().width())
        super().resizeEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self.window().installEventFilter(self)  # its width decides how many readings fit
        self.telemetry.watch("status strip", True)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        if watched is self.window() and event.type() == QEvent.Type.Resize:
            self.updateGeometry()
        return False

    def hideEvent(self, event) -> None:  # noqa: N802
        self.telemetry.watch("status strip", False)
        super().hideEvent(event)

    def mousePressEvent(self, event) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            emit(self.activated)
        super().mousePressEvent(event)
