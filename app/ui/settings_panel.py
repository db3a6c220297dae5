"""The per-conversation settings panel: model, system prompt, thinking, sampling, reply length, context length,
speculation; the same form edits the app-wide defaults new chats start from."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QFrame, QHBoxLayout, QLabel,
                               QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from ..chat_settings import MAX_DRAFT_LIMIT, ChatSettings
from ..paths import file_name
from ..qt_compat import emit
from .theme import NOTICE_COLORS

FIELDS = (  # name, label, kind, minimum, maximum, step, help
    ("temperature", "Temperature", float, 0.0, 2.0, 0.05, "Higher is more varied, 0 always picks the likeliest token"),
    ("top_p", "Top-p", float, 0.0, 1.0, 0.05, "Sample only from the tokens making up this much probability"),
    ("top_k", "Top-k", int, 0, 1000, 1, "Sample only from this many likeliest tokens (0: no limit)"),
    ("min_p", "Min-p", float, 0.0, 1.0, 0.01, "Drop tokens less likely than this share of the likeliest one"),
    ("repeat_penalty", "Repeat penalty", float, 0.5, 2.0, 0.05, "Above 1 discourages repeating recent tokens"),
    ("max_tokens", "Max reply tokens", int, 1, 32768, 64, "The longest answer, in tokens"),
    ("seed", "Seed", int, -1, 2**31 - 1, 1, "The same seed gives the same answer; Random picks a new one each time"),
    ("n_ctx", "Context length", int, 256, 131072, 256, "Tokens the model keeps in view; more uses more memory"),
)
SPECULATION_METHODS = (  # mode, label
    ("off", "Off"), ("lookup", "Prompt lookup"), ("draft", "Draft model"),
)
SPECULATION_TIP = ("Speculative decoding: guess several tokens, then let the model check them in one pass. Prompt "
                   "lookup guesses from text already in the conversation (free; fast when the answer quotes it); a "
                   "draft model is a smaller model with the same vocabulary. Greedy answers stay the same, and it "
                   "switches itself off while the guesses do not pay.")
THINKING_TIP = ("The model reasons before it answers; its thinking is shown folded above the answer. Off: it answers "
                "at once (the model's own switch, enable_thinking).")


class SettingsPanel(QFrame):
    """Edits one conversation's ChatSettings and shows its model; ``set_draft_models`` lists the draft models
    that can speculate for that model; the Thinking switch shows only for a model whose chat template has one
    (``set_thinking_available``).

    Signals:
        settings_changed(object): the new ChatSettings, after an edit settles.
        choose_model_requested(): the user wants to pick another model (the Models page).
    """

    settings_changed = Signal(object)
    choose_model_requested = Signal()

    def __init__(self, parent: QWidget | None = None, for_defaults: bool = False):
        """``for_defaults``: edit the app-wide defaults new chats start from (no model, no draft model; its reset
        goes back to Hearth's own defaults) rather than one conversation's settings."""
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self._loading = False
        self.for_defaults = for_defaults
        self.reset_settings = ChatSettings  # what "Reset to defaults" restores: the window sets the app's defaults
        self.model_name = QLabel("—")
        self.model_name.setWordWrap(True)
        self.model_name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        change = QPushButton("Change…")
        change.clicked.connect(self.choose_model_requested)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_name, 1)
        model_row.addWidget(change)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Instructions the model follows in this conversation")
        self.system_prompt.setFixedHeight(96)
        self.system_prompt.textChanged.connect(self._changed_soon)
        self.thinking = QCheckBox("Thinking")
        self.thinking.setToolTip(THINKING_TIP)
        self.thinking.setAccessibleName("Thinking")
        self.thinking.toggled.connect(self._changed_soon)
        self.thinking.hide()  # until the model's template is known to have the switch
        self.inputs: dict[str, QSpinBox | QDoubleSpinBox] = {}
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        for name, label, kind, low, high, step, tip in FIELDS:
            box = QDoubleSpinBox() if kind is float else QSpinBox()
            box.setRange(low, high)
            box.setSingleStep(step)
            if kind is float:
                box.setDecimals(2)
            box.setToolTip(tip)
            box.setAccessibleName(label)
            box.setKeyboardTracking(False)
            box.valueChanged.connect(self._changed_soon)
            if name == "seed":
                box.setSpecialValueText("Random")
            self.inputs[name] = box
            form.addRow(label, box)
        form.addRow("Speculative decoding", self._speculation_controls())
        form.addRow("Draft model", self.draft_model)
        form.addRow("Max draft length", self.max_draft)
        reset = QPushButton("Reset to Hearth's defaults" if for_defaults else "Reset to defaults")
        reset.setToolTip("Hearth's own settings" if for_defaults else "The settings new chats start from "
                                                                         "(the Default settings page)")
        reset.clicked.connect(lambda: (self.set_settings(self.reset_settings()), self._emit()))
        self._timer = QTimer(self, singleShot=True, interval=300)
        self._timer.timeout.connect(self._emit)
        title = QLabel("Conversation settings")
        title.setObjectName("panelTitle")
        title.setVisible(not for_defaults)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(14, 14, 14, 14)
        layout.setSpacing(8)
        layout.addWidget(title)
        if not for_defaults:  # the defaults are for any model; a draft model belongs to one model's vocabulary
            layout.addWidget(QLabel("Model"))
            layout.addLayout(model_row)
        else:
            form.setRowVisible(self.draft_model, False)
            self.thinking.setVisible(True)
            self.thinking.setToolTip(THINKING_TIP + " Applies to models whose chat template has this switch.")
        layout.addWidget(QLabel("System prompt"))
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.thinking)
        layout.addLayout(form)
        layout.addWidget(self.draft_note)
        layout.addWidget(reset, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.setMinimumWidth(260)

    def _speculation_controls(self) -> QComboBox:
        self.speculation = QComboBox()
        for mode, label in SPECULATION_METHODS:
            self.speculation.addItem(label, mode)
        self.draft_model = QComboBox()
        self.draft_model.setToolTip("Models in the library with this model's vocabulary (see the Models page)")
        self.max_draft = QSpinBox()
        self.max_draft.setRange(1, MAX_DRAFT_LIMIT)
        self.max_draft.setKeyboardTracking(False)
        self.max_draft.setToolTip("The most tokens guessed per check; fewer are guessed while guesses miss")
        self.draft_note = QLabel()
        self.draft_note.setWordWrap(True)
        self.draft_note.setStyleSheet(f"color: {NOTICE_COLORS['warning']};")
        self.draft_note.hide()
        self._draft_models: list[tuple[str, str]] = []  # (name, path) that can draft for the model shown
        self._speculation_off: str | None = None  # why speculation cannot apply to this model (a remote one)
        self.speculation.setToolTip(SPECULATION_TIP)
        for box, name in ((self.speculation, "Speculative decoding"), (self.draft_model, "Draft model")):
            box.setAccessibleName(name)
            box.currentIndexChanged.connect(self._changed_soon)
            box.currentIndexChanged.connect(self._show_speculation)
        self.max_draft.setAccessibleName("Max draft length")
        self.max_draft.valueChanged.connect(self._changed_soon)
        return self.speculation

    def set_settings(self, settings: ChatSettings) -> None:
        """Show ``settings`` without emitting settings_changed."""
        self._loading = True
        self.system_prompt.setPlainText(settings.system_prompt)
        self.thinking.setChecked(settings.enable_thinking)
        for name, box in self.inputs.items():
            box.setValue(getattr(settings, name))
        self.speculation.setCurrentIndex(max(0, self.speculation.findData(settings.speculation)))
        self.max_draft.setValue(settings.max_draft)
        self._fill_draft_models(settings.draft_model)
        self._loading = False
        self._timer.stop()

    def set_draft_models(self, models: list[tuple[str, str]]) -> None:
        """The models, as (name, path), that can draft for this conversation's model; the chosen one stays
        chosen (marked unavailable when it is not among them)."""
        self._draft_models = list(models)
        loading, self._loading = self._loading, True
        self._fill_draft_models(self.draft_model.currentData() or "")
        self._loading = loading

    def _fill_draft_models(self, chosen: str) -> None:
        self.draft_model.clear()
        for name, path in self._draft_models:
            self.draft_model.addItem(name, path)
            self.draft_model.setItemData(self.draft_model.count() - 1, path, Qt.ItemDataRole.ToolTipRole)
        if chosen and self.draft_model.findData(chosen) < 0:
            self.draft_model.addItem(f"{file_name(chosen)} (not usable)", chosen)
        self.draft_model.setCurrentIndex(self.draft_model.findData(chosen) if chosen else 0)
        self._show_speculation()

    def set_speculation_unavailable(self, reason: str | None) -> None:
        """Grey out the speculative-decoding settings with ``reason`` (a remote model); None enables them."""
        self._speculation_off = reason
        self.speculation.setEnabled(reason is None)
        self.speculation.setToolTip(reason or SPECULATION_TIP)
        self._show_speculation()

    def _show_speculation(self, *_) -> None:
        mode = self.speculation.currentData()
        usable = self._speculation_off is None
        self.draft_model.setEnabled(usable and mode == "draft")
        self.max_draft.setEnabled(usable and mode != "off")
        self.draft_note.setText(self._draft_problem() if mode == "draft" else "")
        self.draft_note.setVisible(bool(self.draft_note.text()))

    def _draft_problem(self) -> str:
        if self.for_defaults:
            return "A new chat picks its draft model in its own settings, among those that fit its model."
        chosen = self.draft_model.currentData()
        usable = {path for _, path in self._draft_models}
        if not usable and not chosen:
            return ("No model in the library has this model's vocabulary, so none can draft for it. Add a smaller "
                    "model of the same family on the Models page, or use prompt lookup.")
        if chosen not in usable:
            return ("This draft model is missing or does not share this model's vocabulary; answers are generated "
                    "without speculative decoding until another is chosen.")
        return ""

    def set_model(self, text: str) -> None:
        self.model_name.setText(text)

    def set_thinking_available(self, available: bool) -> None:
        """Show the Thinking switch: the model's chat template reads ``enable_thinking`` (always, for defaults)."""
        self.thinking.setVisible(available or self.for_defaults)

    def settings(self) -> ChatSettings:
        values = {name: box.value() for name, box in self.inputs.items()}
        return dataclasses.replace(ChatSettings(), system_prompt=self.system_prompt.toPlainText(), **values,
                                   enable_thinking=self.thinking.isChecked(),
                                   speculation=self.speculation.currentData(),
                                   draft_model=self.draft_model.currentData() or "", max_draft=self.max_draft.value())

    def flush(self) -> None:
        """Emit an edit still waiting for its pause, so it applies before the next message."""
        if self._timer.isActive():
            self._emit()

    def _changed_soon(self, *_) -> None:
        if not self._loading:
            self._timer.start()

    def _emit(self) -> None:
        self._timer.stop()
        emit(self.settings_changed, self.settings())
