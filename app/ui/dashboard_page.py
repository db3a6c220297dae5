"""The Dashboard page: live charts of the engine and the machine, the loaded model's memory, recent answers.

It renders what ``Telemetry`` collected and samples nothing itself; while it is hidden it asks for no
detailed samples and draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFrame, QGridLayout, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QScrollArea, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..generation_history import COLUMNS, GenerationRecord, export_csv
from ..qt_compat import emit
from ..speculation import speculation_text
from ..telemetry import THERMAL_LEVELS, EngineSample, MemoryBreakdown, SystemSample, Telemetry, format_bytes
from .charts import ChartCard, Line, StackedBar, TimeChart, legend_html, nice_ceiling
from .remote_card import RemoteCard
from .theme import NOTICE_COLORS

WINDOWS_S = (60, 120, 300)
HISTORY_ROWS = 50
EXPORT_LIMIT = 100_000

LIMITS_TIP = ("How hard the engine works. Prompt chunk: how many prompt tokens it reads in one step (at most 128). "
              "Replies at once: how many answers it writes together. Solid: what it uses now. Dashed: what the "
              "thermal policy allows, as of the engine's last step.")
THERMAL_MODE_TIP = ("Thermal mode. Performance tolerates a warm machine; Balanced backs off as it heats; Cool keeps "
                    "the load low even when the machine is cool. Applies from the next answer.")
CARD_ORDER = ("decode", "prefill", "cpu", "thermal", "process", "system", "limits", "memory")
# with a remote model the server's card stands for the local engine's memory, thermal and limits cards
REMOTE_CARD_ORDER = ("decode", "prefill", "remote", "cpu", "system")
FOUR_COLUMNS_PX, TWO_COLUMNS_PX = 960, 480  # page widths from which the cards sit 4 or 2 to a row

GenerationLoader = Callable[[int], list[GenerationRecord]]  # (most rows) -> newest first
THERMAL_MODE_LABELS = {"performance": "Performance", "balanced": "Balanced", "cool": "Cool"}


class ThermalModeSetting(Protocol):
    """Where the app-wide thermal mode lives (the ChatController)."""

    def thermal_mode(self) -> str: ...

    def set_thermal_mode(self, mode: str) -> None: ...


class MemoryView(QWidget):
    """The loaded model's share of the process memory, and its KV cache: used, allocated, maximum.

    Signals:
        none.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.process_bar, self.kv_bar = StackedBar(), StackedBar()
        self.process_text, self.kv_text, self.warning = QLabel(), QLabel(), QLabel()
        self.kv_title = QLabel("Conversation memory (KV cache)")
        self.kv_title.setObjectName("cardTitle")
        for label in (self.process_text, self.kv_text, self.warning):
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)
        self.kv_text.setObjectName("cardLegend")
        self.warning.setStyleSheet(f"color: {NOTICE_COLORS['warning']};")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(4)
        for widget in (self.process_bar, self.process_text, self.kv_title, self.kv_bar, self.kv_text, self.warning):
            layout.addWidget(widget)
        layout.addStretch(1)

    def show_breakdown(self, b: MemoryBreakdown | None, warnings: list[str]) -> None:
        if b is None:
            self.process_bar.set_parts([])
            self.kv_bar.set_parts([])
            self.process_text.setText("No model is loaded.")
            self.kv_text.setText("")
        else:
            self.process_bar.set_parts([(b.weights_bytes, "weights", False), (b.kv_allocated_bytes, "kv", False),
                                        (b.scratch_bytes, "scratch", False), (b.other_bytes, "other", False)])
            weights = f"weights {format_bytes(b.weights_bytes)}"
            if b.sparse:  # a mixture of experts: all experts resident, the chosen ones read per token
                weights += f" (all experts; {format_bytes(b.active_weights_bytes)} read per token)"
            self.process_text.setText(legend_html([("weights", weights),
                                             ("kv", f"KV cache {format_bytes(b.kv_allocated_bytes)}"),
                                             ("scratch", f"scratch {format_bytes(b.scratch_bytes)}"),
                                             ("other", f"other {format_bytes(b.other_bytes)}")]))
            used = min(b.kv_used_bytes, b.kv_allocated_bytes)
            self.kv_bar.set_parts([(used, "kv", False), (b.kv_allocated_bytes - used, "kv", True)], b.kv_max_bytes)
            self.kv_text.setText(
                f"{b.kv_used_positions:,} of {b.n_ctx:,} positions used ({format_bytes(b.kv_used_bytes)}) · "
                f"{format_bytes(b.kv_allocated_bytes)} allocated · {format_bytes(b.kv_max_bytes)} at the full context")
        self.warning.setText("<br>".join(f"⚠ {w}" for w in warnings))
        self.warning.setVisible(bool(warnings))


class DashboardPage(QScrollArea):
    """Charts, memory and recent answers; draws once a second while shown.

    Signals:
        export_finished(str): a readable line saying where the CSV was written, or why it was not.
    """

    export_finished = Signal(str)

    def __init__(self, telemetry: Telemetry, load_generations: GenerationLoader,
                 thermal_mode: ThermalModeSetting | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.telemetry = telemetry
        self.load_generations = load_generations
        self.thermal_mode = thermal_mode
        self.model_info: dict = {}
        self.setObjectName("dashboard")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self._build()
        telemetry.system_sampled.connect(self._on_system)
        telemetry.engine_sampled.connect(self._on_engine)

    # -- building ------------------------------------------------------------------------------------
    def _build(self) -> None:
        body = QWidget()
        body.setObjectName("dashboardBody")
        layout = QVBoxLayout(body)
        layout.setContentsMargins(20, 14, 20, 16)
        layout.setSpacing(10)
        layout.addLayout(self._header())
        self.grid = QGridLayout()
        self.grid.setSpacing(10)
        self.columns = 0
        self.charts = self._make_charts()
        self.cards = {name: ChartCard(title, chart) for name, (title, chart) in self.charts.items()}
        self.memory_view = MemoryView()
        self.cards["memory"] = ChartCard("Model memory", self.memory_view)
        self.cards["remote"] = self.remote_card = RemoteCard()
        self.remote = False  # the loaded model runs on a remote server
        self._arrange(4)
        self.cards["limits"].setToolTip(LIMITS_TIP)
        self.cards["decode"].setToolTip("With speculative decoding: the share of drafted tokens the model accepted, "
                                        "and decode speed over the plain decode step speed it measured (estimated)")
        layout.addLayout(self.grid)
        layout.addWidget(self._history_card())
        self.setWidget(body)

    def _header(self) -> QHBoxLayout:
        title = QLabel("Live dashboard")
        title.setObjectName("pageTitle")
        self.subtitle = QLabel("No model loaded")
        self.subtitle.setObjectName("cardLegend")
        self.compute_label = QLabel("")  # how the backend computes this model (MLX's dtype and why), when it says
        self.compute_label.setObjectName("cardLegend")
        self.compute_label.setWordWrap(True)
        self.compute_label.hide()
        self.window_box = QComboBox()
        for seconds in WINDOWS_S:
            self.window_box.addItem(f"Last {seconds // 60} min" if seconds >= 60 else f"Last {seconds} s", seconds)
        self.window_box.setCurrentIndex(WINDOWS_S.index(120))
        self.window_box.currentIndexChanged.connect(lambda _: self.set_window(self.window_box.currentData()))
        header = QHBoxLayout()
        header.addWidget(title)
        header.addSpacing(12)
        header.addWidget(self.subtitle, 1, Qt.AlignmentFlag.AlignBottom)
        header.addWidget(self.compute_label, 1, Qt.AlignmentFlag.AlignBottom)
        self.mode_box = QComboBox()
        self.mode_box.setToolTip(THERMAL_MODE_TIP)
        for mode, label in THERMAL_MODE_LABELS.items():
            self.mode_box.addItem(label, mode)
        if self.thermal_mode is not None:
            self.mode_box.setCurrentIndex(self.mode_box.findData(self.thermal_mode.thermal_mode()))
            self.mode_box.currentIndexChanged.connect(
                lambda _: self.thermal_mode.set_thermal_mode(self.mode_box.currentData()))
        else:
            self.mode_box.setEnabled(False)
        mode_label = QLabel("Thermal mode")
        mode_label.setObjectName("cardLegend")
        mode_label.setBuddy(self.mode_box)
        header.addWidget(mode_label, 0, Qt.AlignmentFlag.AlignVCenter)
        header.addWidget(self.mode_box)
        header.addSpacing(8)
        header.addWidget(self.window_box)
        return header

    def _make_charts(self) -> dict[str, tuple[str, TimeChart]]:
        cores = self.telemetry.sampler.cpu_count
        return {
            "decode": ("Reply speed", TimeChart([Line("decode_tps", "decode")], "tok/s", y_floor=10)),
            "prefill": ("Prompt reading speed", TimeChart([Line("prefill_tps", "prefill", step=True, markers=True)],
                                                       "tok/s", y_floor=100)),
            "cpu": ("CPU", TimeChart([Line("cpu_system", "system"), Line("cpu_process", "hearth")],
                                     f"% of {cores} cores", y_max=100)),
            "thermal": ("Thermal state", TimeChart([Line("thermal", "thermal", step=True)], "",
                                                   levels=[s.value for s in THERMAL_LEVELS])),
            "process": ("Hearth memory", TimeChart(
                [Line("rss", "hearth", 1e-6), Line("kv_allocated", "kv", 1e-6, step=True),
                 Line("device_active_bytes", "device", 1e-6), Line("device_peak_bytes", "device", 1e-6, dashed=True),
                 Line("device_cache_bytes", "other", 1e-6)], "MB", y_floor=100)),
            "system": ("System memory", TimeChart([Line("system_used", "system", 1e-9),
                                                   Line("system_available", "available", 1e-9)], "GB")),
            "limits": ("Workload limits", TimeChart(
                [Line("allowed_chunk", "chunk", step=True, dashed=True), Line("prefill_chunk", "chunk", step=True),
                 Line("allowed_batch", "batch", step=True, dashed=True, right=True),
                 Line("batch", "batch", step=True, right=True)],
                "tokens", y_max=640, y_ticks=6, right_title="replies", right_max=16)),
        }

    def _history_card(self) -> ChartCard:
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([header for _, _, header in COLUMNS])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setMinimumHeight(110)
        head = self.table.horizontalHeader()
        head.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        head.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        card = ChartCard("Recent answers", self.table)
        self.export_status = QLabel()
        self.export_status.setObjectName("cardLegend")
        self.export_button = QPushButton("Export CSV…")
        self.export_button.clicked.connect(self._ask_export)
        card.header.addWidget(self.export_status)
        card.header.addWidget(self.export_button)
        card.legend.hide()
        self.table.setToolTip("Per answer: the model that wrote it, its prompt's tokens (and how many were reused from "
                              "memory), the reply's tokens, time to first token, and the speed of reading the prompt "
                              "and of writing the reply")
        return card

    def _arrange(self, columns: int) -> None:
        """Lay the cards out in ``columns`` columns (4 on a wide window, 2 or 1 on a narrow one)."""
        if columns == self.columns:
            return
        self.columns = columns
        for card in self.cards.values():
            self.grid.removeWidget(card)
            if card is self.remote_card or self.grid.parentWidget() is not None:
                card.hide()
        for i, name in enumerate(REMOTE_CARD_ORDER if self.remote else CARD_ORDER):
            self.grid.addWidget(self.cards[name], i // columns, i % columns)
            if self.grid.parentWidget() is not None:  # (while building, a card without a parent would open a window)
                self.cards[name].show()
        for column in range(4):
            self.grid.setColumnStretch(column, 1 if column < columns else 0)

    def resizeEvent(self, event) -> None:  # noqa: N802
        width = self.viewport().width()
        self._arrange(4 if width >= FOUR_COLUMNS_PX else 2 if width >= TWO_COLUMNS_PX else 1)
        super().resizeEvent(event)

    # -- state from outside --------------------------------------------------------------------------
    def set_model(self, info: dict) -> None:
        """The loaded model's info (name, backend, n_ctx, compute), or {} when none is loaded."""
        self.model_info = dict(info)
        remote = info.get("remote")
        if bool(remote) != self.remote:
            self.remote, columns, self.columns = bool(remote), self.columns, 0
            self._arrange(columns)
        if remote:
            self.remote_card.set_endpoint(remote["endpoint"], remote["model_id"])
        reason = (info.get("unsupported") or {}).get("thermal")
        self.mode_box.setEnabled(self.thermal_mode is not None and reason is None)
        self.mode_box.setToolTip(reason or THERMAL_MODE_TIP)
        if info:
            self.subtitle.setText(f"{info.get('name', 'Model')} · {info.get('backend') or 'unknown'} backend · "
                                  f"context {info.get('n_ctx', 0):,} tokens")
        else:
            self.subtitle.setText("No model loaded")
        self.compute_label.setText(info.get("compute") or "")
        self.compute_label.setVisible(bool(info.get("compute")))

    def set_window(self, seconds: int) -> None:
        for _, chart in self.charts.values():
            chart.set_window(seconds)
        if self.isVisible():
            self.redraw()

    def refresh_generations(self) -> None:
        """Reload the recent answers (call after an answer finishes)."""
        if self.isVisible():
            self._fill_table(self.load_generations(HISTORY_ROWS))

    # -- rendering -----------------------------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self.telemetry.watch("dashboard", True, detailed=True)  # samples at once, which redraws
        self._fill_table(self.load_generations(HISTORY_ROWS))

    def hideEvent(self, event) -> None:  # noqa: N802
        self.telemetry.watch("dashboard", False)
        super().hideEvent(event)

    def _on_system(self, sample: SystemSample) -> None:
        if self.isVisible():
            self.redraw()

    def _on_engine(self, sample: EngineSample) -> None:
        if self.isVisible() and self.telemetry.system is not None:
            self._show_values()

    def redraw(self) -> None:
        """Draw every chart and value from the telemetry collected so far."""
        system = self.telemetry.system
        if system is None:
            return
        self.charts["system"][1].set_y_max(nice_ceiling(system.total_bytes / 1e9))
        for _, chart in self.charts.values():
            chart.render(self.telemetry.history, system.time)
        self._show_values()

    def _show_values(self) -> None:
        t, s, e = self.telemetry, self.telemetry.system, self.telemetry.engine
        cards = self.cards
        cards["decode"].set_legend([("decode", _decode_text(t.decode_tps(), e))])
        cards["prefill"].set_legend([("prefill", _prefill_text(e))])
        cards["cpu"].set_legend([("hearth", f"Hearth {s.process_cpu_percent:.0f}%"),
                                 ("system", f"system {s.system_cpu_percent:.0f}%")])
        cards["thermal"].set_legend([("thermal", _thermal_text(s))])
        cards["thermal"].setToolTip(f"Thermal state from {s.thermal_source}")
        cards["process"].set_legend(_process_items(s, e))
        cards["system"].set_legend([("system", f"used {format_bytes(s.used_bytes)}"),
                                    ("available", f"available {format_bytes(s.available_bytes)}")])
        chunk = f"prompt chunk {e.prefill_chunk or '–'} tokens (up to {s.allowed_prefill_chunk})"
        replies = f"replies at once {e.batch} (up to {s.allowed_batch})"
        cards["limits"].set_legend([("chunk", chunk), ("batch", replies)])
        if e.remote is not None:
            self.remote_card.show_stats(e.remote)
        decision = t.decision
        cards["limits"].setToolTip(LIMITS_TIP if decision is None else f"{LIMITS_TIP}\n\n{_decision_text(decision)}")
        self.memory_view.show_breakdown(t.breakdown(), t.warnings())
        cards["memory"].set_legend([("hearth", f"Hearth {format_bytes(s.rss_bytes)} resident, made of")])

    def _fill_table(self, records: list[GenerationRecord]) -> None:
        self.table.setRowCount(len(records))
        for row, record in enumerate(records):
            for column, text in enumerate(record.cells()):
                item = QTableWidgetItem(text)
                if column >= 3 and column != len(COLUMNS) - 1:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, column, item)

    # -- export --------------------------------------------------------------------------------------
    def _ask_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export recent answers", "hearth-answers.csv", "CSV (*.csv)")
        if path:
            self.export_to(path)

    def export_to(self, path: str) -> None:
        """Write every recorded answer's stats to ``path`` as CSV."""
        try:
            rows = export_csv(self.load_generations(EXPORT_LIMIT), path)
        except OSError as exc:
            text = f"Could not write {path}: {exc.strerror or exc}"
        else:
            text = f"Saved {rows:,} answers to {path.replace(chr(92), '/').rsplit('/', 1)[-1]}"
        self.export_status.setText(text)
        emit(self.export_finished, text)


def _decode_text(rate: float, e: EngineSample) -> str:
    if e.phase == "decode" and e.batch > 1:
        return f"{rate:.1f} tok/s in all · {e.batch} replies decoding together"
    if e.phase == "decode":
        return f"{rate:.1f} tok/s · {e.generated_tokens:,} tokens" + _speculation_text(e)
    if e.phase == "prefill":
        return "reading the prompt…"
    return "idle" + (f" · last answer {(e.generated_tokens - 1) / e.decode_s:.1f} tok/s"
                     if e.decode_s > 0 and e.generated_tokens > 1 else "") + _speculation_text(e)


def _speculation_text(e: EngineSample) -> str:
    """The answer's speculative decoding: its acceptance so far and the estimated speed-up; '' without it."""
    if not e.speculation:
        return ""
    return " · " + speculation_text(e.speculation, e.drafted_tokens, e.accepted_tokens, e.speedup_estimate)


def _prefill_text(e: EngineSample) -> str:
    if e.prefill_s <= 0:
        return "reading the prompt…" if e.phase == "prefill" else "no prompt yet"
    computed = e.prompt_tokens - e.cached_tokens
    return f"{e.prefill_tps:,.0f} tok/s · {computed:,} tokens · {e.cached_tokens:,} cached"


def _decision_text(d) -> str:
    """The thermal policy's last decision (engine.thermal.PolicyDecision), for the limits card's tooltip."""
    pause = f", {d.pause_s:g} s rest between tokens" if d.pause_s else ""
    drafts = f"{d.max_draft} drafted tokens a pass" if d.max_draft else "no speculative drafts"
    return (f"{THERMAL_MODE_LABELS[d.mode.value]} mode, level {d.level}: prefill chunks of {d.prefill_chunk}, "
            f"{d.max_batch} sequences, {drafts}{pause}. Why: {d.reason}.")


def _thermal_text(s: SystemSample) -> str:
    if s.thermal.value == "unknown":
        return "unknown (no usable sensor)"
    return s.thermal.value


def _process_items(s: SystemSample, e: EngineSample) -> list[tuple[str, str]]:
    items = [("hearth", f"Hearth {format_bytes(s.rss_bytes)}")]
    if e.kv is not None:
        items.append(("kv", f"conversation memory (KV cache) {format_bytes(e.kv.allocated_bytes)}"))
    if e.device_active_bytes is not None:
        peak = format_bytes(e.device_peak_bytes or 0)
        items.append(("device", f"MLX active {format_bytes(e.device_active_bytes)} (peak {peak})"))
        items.append(("other", f"MLX cache {format_bytes(e.device_cache_bytes or 0)}"))
    return items
