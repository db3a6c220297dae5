"""Scrolling time charts (QtCharts) and a stacked bar for the dashboard, coloured from one table of metric colours.

A chart's axes are fixed: time runs from ``-window`` seconds to now and the y range only changes when the data
outgrows it. Each render replaces every series' points in one call (``QXYSeries.replace``), so a frame costs
one repaint of the plot area and nothing flickers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from PySide6.QtCharts import QCategoryAxis, QChart, QChartView, QLineSeries, QScatterSeries, QValueAxis
from PySide6.QtCore import QEvent, QMargins, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from ..telemetry import TelemetryHistory
from .theme import mix, tone

# One colour per metric, on every chart, bar and in the status strip; mid tones that read on light and dark.
COLORS = {
    "decode": "#3f88d8",
    "prefill": "#9b6fd1",
    "hearth": "#e8772e",  # this process: its memory and CPU
    "kv": "#d9a520",
    "weights": "#2fa39a",
    "scratch": "#b07aa1",
    "other": "#98a1ab",
    "system": "#7f8a99",
    "available": "#4caf6a",
    "thermal": "#e15759",
    "chunk": "#2bb0c8",
    "batch": "#d9559a",
    "device": "#6f63d9",  # MLX device memory
}


CHART_HEIGHT = 160


@dataclasses.dataclass(frozen=True)
class Line:
    """One series of a chart: a history series drawn in a metric's colour."""

    key: str  # the TelemetryHistory series
    color: str  # a COLORS key
    scale: float = 1.0  # value -> axis unit (bytes -> MB)
    step: bool = False  # the value holds until the next point (states, limits, prefill)
    dashed: bool = False
    markers: bool = False  # a dot where each step up starts (short prefills stay visible)
    right: bool = False  # on the right-hand axis


def nice_ceiling(value: float, ticks: int = 4) -> float:
    """The smallest ``ticks * step`` >= ``value`` with step 1, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten."""
    if value <= 0:
        return float(ticks)
    raw = value / ticks
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= raw * (1 - 1e-9))
    return step * ticks


def time_labels(window_s: float) -> tuple[str, list[tuple[float, str]]]:
    """The time axis' title and ticks: ``(x, label)`` with x in seconds before now (negative), the last at 0."""
    minutes = window_s >= 300
    step = 60.0 if minutes else window_s / 4
    ticks = []
    x = -window_s + step
    while x <= 1e-9:
        ago = -x
        ticks.append((x, "now" if ago < 1e-9 else f"{ago / 60:.0f}" if minutes else f"{ago:.0f}"))
        x += step
    return ("minutes ago" if minutes else "seconds ago"), ticks


def chart_points(points: list[tuple[float, float]], now: float, scale: float, step: bool) -> list[QPointF]:
    """History points as chart points: x in seconds before ``now``, the last value held until now."""
    out: list[QPointF] = []
    for t, v in points:
        if step and out:
            out.append(QPointF(t - now, out[-1].y()))
        out.append(QPointF(t - now, v * scale))
    if out and out[-1].x() < 0:
        out.append(QPointF(0.0, out[-1].y()))
    return out


def step_starts(points: list[tuple[float, float]], now: float, scale: float) -> list[QPointF]:
    previous = 0.0
    starts = []
    for t, v in points:
        if v > 0 and previous == 0:
            starts.append(QPointF(t - now, v * scale))
        previous = v
    return starts


def legend_html(items: Sequence[tuple[str, str]]) -> str:
    """Rich text of ``(colour key, text)`` pairs, each after a dot of its colour."""
    return "&nbsp;&nbsp; ".join(f"<span style='color:{COLORS[c]}'>●</span>&nbsp;{text}" for c, text in items)


class TimeChart(QChartView):
    """Lines over the last ``window`` seconds; y from 0 to a fixed or data-grown maximum, or named levels.

    Signals:
        none of its own; it only draws.
    """

    def __init__(self, lines: Sequence[Line], y_title: str, y_max: float | None = None, y_floor: float = 1.0,
                 levels: Sequence[str] = (), right_title: str = "", right_max: float | None = None,
                 y_ticks: int = 5, parent: QWidget | None = None):
        super().__init__(parent)
        self.lines, self.y_max, self.y_floor, self.levels = list(lines), y_max, y_floor, list(levels)
        self.y_ticks = y_ticks
        self.window_s = 120.0
        self.renders = 0
        chart = QChart()
        chart.legend().hide()
        chart.setMargins(QMargins(2, 4, 4, 0))
        chart.setBackgroundRoundness(0)
        chart.setBackgroundVisible(False)
        self.setChart(chart)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setMinimumWidth(200)
        self.setFixedHeight(CHART_HEIGHT)
        self.x_axis = QCategoryAxis()
        self.x_axis.setLabelsPosition(QCategoryAxis.AxisLabelsPosition.AxisLabelsPositionOnValue)
        self.y_axis = self._level_axis(levels) if levels else QValueAxis()
        self.y_axis.setTitleText(y_title)
        chart.addAxis(self.x_axis, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.y_axis, Qt.AlignmentFlag.AlignLeft)
        self.right_axis = None
        if right_title:
            self.right_axis = QValueAxis()
            self.right_axis.setTitleText(right_title)
            self.right_axis.setRange(0, right_max or 1)
            self.right_axis.setTickCount(5)
            self.right_axis.setLabelFormat("%d")
            chart.addAxis(self.right_axis, Qt.AlignmentFlag.AlignRight)
        if not levels:
            self._set_y_range(y_max or y_floor)
        self.series = [self._add_series(line) for line in self.lines]
        self.markers = {line.key: self._add_markers(line) for line in self.lines if line.markers}
        self.set_window(self.window_s)
        self.apply_palette(self.palette())

    def _level_axis(self, levels: Sequence[str]) -> QCategoryAxis:
        axis = QCategoryAxis()
        axis.setLabelsPosition(QCategoryAxis.AxisLabelsPosition.AxisLabelsPositionCenter)
        axis.setStartValue(-0.5)
        for i, name in enumerate(levels):
            axis.append(name, i + 0.5)
        axis.setRange(-0.5, len(levels) - 0.5)
        return axis

    def _attach(self, series, line: Line) -> None:
        self.chart().addSeries(series)
        series.attachAxis(self.x_axis)
        series.attachAxis(self.right_axis if line.right and self.right_axis else self.y_axis)

    def _add_series(self, line: Line) -> QLineSeries:
        series = QLineSeries()
        pen = QPen(QColor(COLORS[line.color]), 2)
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        if line.dashed:
            pen.setStyle(Qt.PenStyle.DashLine)
            pen.setWidthF(1.5)
        series.setPen(pen)
        self._attach(series, line)
        return series

    def _add_markers(self, line: Line) -> QScatterSeries:
        dots = QScatterSeries()
        dots.setMarkerSize(7)
        dots.setColor(QColor(COLORS[line.color]))
        dots.setBorderColor(QColor(COLORS[line.color]))
        self._attach(dots, line)
        return dots

    def set_window(self, seconds: float) -> None:
        """Show the last ``seconds``; the time axis keeps these bounds while the data scrolls through it."""
        self.window_s = float(seconds)
        for label in self.x_axis.categoriesLabels():
            self.x_axis.remove(label)
        self.x_axis.setStartValue(-self.window_s)
        title, ticks = time_labels(self.window_s)
        for x, label in ticks:
            self.x_axis.append(label, x)
        self.x_axis.setTitleText(title)
        self.x_axis.setRange(-self.window_s, 0)

    def render(self, history: TelemetryHistory, now: float) -> None:
        """Replace every series with the history of the last ``window`` seconds."""
        since = now - self.window_s
        for line, series in zip(self.lines, self.series):
            points = history.points(line.key, since)
            series.replace(chart_points(points, now, line.scale, line.step))
            if line.key in self.markers:
                self.markers[line.key].replace(step_starts(points, now, line.scale))
        if self.y_max is None and not self.levels:
            left = [line for line in self.lines if not line.right]
            peak = max((v * line.scale for line in left for _, v in history.points(line.key)), default=0.0)
            self._set_y_range(max(peak, self.y_floor))
        self.renders += 1

    def set_y_max(self, value: float) -> None:
        """Fix the y axis at 0..``value`` (a total known from elsewhere, such as the machine's memory)."""
        self.y_max = value
        self._set_y_range(value)

    def _set_y_range(self, peak: float) -> None:
        top = nice_ceiling(peak) if self.y_max is None else self.y_max
        if self.y_axis.max() != top or self.y_axis.min() != 0:
            self.y_axis.setRange(0, top)
            self.y_axis.setTickCount(self.y_ticks)
            step = top / (self.y_ticks - 1)
            self.y_axis.setLabelFormat("%d" if step == int(step) else "%.1f")

    def apply_palette(self, palette: QPalette) -> None:
        base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.WindowText)
        muted, grid = tone(palette, "muted"), mix(base, text, 0.12)
        self.setBackgroundBrush(QBrush(base))
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() * 0.82))
        axes = [a for a in (self.x_axis, self.y_axis, self.right_axis) if a is not None]
        for axis in axes:
            axis.setLabelsColor(muted)
            axis.setLabelsFont(font)
            axis.setTitleBrush(QBrush(muted))
            axis.setTitleFont(font)
            axis.setGridLineColor(grid)
            axis.setLinePen(QPen(grid, 1))
            axis.setMinorGridLineVisible(False)
        if self.right_axis is not None:
            self.right_axis.setGridLineVisible(False)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        if event.type() == QEvent.Type.PaletteChange:
            self.apply_palette(self.palette())
        super().changeEvent(event)


class StackedBar(QWidget):
    """A horizontal bar of coloured parts: ``(value, colour key)``; ``track`` is the full length (the sum if 0).

    A part marked light is drawn paler: allocated-but-unused KV cache, for instance.

    Signals:
        none.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.parts: list[tuple[float, str, bool]] = []
        self.track = 0.0
        self.setMinimumHeight(14)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(200, 14)

    def set_parts(self, parts: Sequence[tuple[float, str, bool]], track: float = 0.0) -> None:
        parts, track = list(parts), float(track)
        if (parts, track) != (self.parts, self.track):
            self.parts, self.track = parts, track
            self.update()

    def paintEvent(self, event) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        base = palette.color(QPalette.ColorRole.Base)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(mix(base, palette.color(QPalette.ColorRole.WindowText), 0.1))
        painter.drawRoundedRect(rect, 4, 4)
        total = self.track or sum(v for v, _, _ in self.parts)
        if total <= 0:
            return
        painter.setClipRect(rect)
        x = rect.left()
        for value, color, light in self.parts:
            width = rect.width() * value / total
            fill = QColor(COLORS[color])
            painter.setBrush(mix(base, fill, 0.4) if light else fill)
            painter.drawRect(QRectF(x, rect.top(), width, rect.height()))
            x += width
        painter.end()


class ChartCard(QFrame):
    """A titled card: the title, a line of coloured values (the legend), and the chart or other content.

    Signals:
        none.
    """

    def __init__(self, title: str, content: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chartCard")
        self.title = QLabel(title)
        self.title.setObjectName("cardTitle")
        self.legend = QLabel()
        self.legend.setObjectName("cardLegend")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        self.content = content
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 6)
        layout.setSpacing(2)
        self.header = QHBoxLayout()
        self.header.addWidget(self.title)
        self.header.addStretch(1)
        layout.addLayout(self.header)
        layout.addWidget(self.legend)
        layout.addWidget(content, 1)

    def set_legend(self, items: Sequence[tuple[str, str]]) -> None:
        """``(colour key, text)`` pairs, each shown after a dot of its colour."""
        html = legend_html(items)
        if html != self.legend.text():
            self.legend.setText(html)
