"""The per-conversation settings panel: model, system prompt, sampling, reply length and context length."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QDoubleSpinBox, QFormLayout, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from ..chat_settings import ChatSettings
from ..qt_compat import emit

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


class SettingsPanel(QFrame):
    """Edits one conversation's ChatSettings and shows its model.

    Signals:
        settings_changed(object): the new ChatSettings, after an edit settles.
        choose_model_requested(): the user wants to pick another model (the Models page).
    """

    settings_changed = Signal(object)
    choose_model_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self._loading = False
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
        reset = QPushButton("Reset to defaults")
        reset.clicked.connect(lambda: (self.set_settings(ChatSettings()), self._emit()))
        self._timer = QTimer(self, singleShot=True, interval=300)
        self._timer.timeout.connect(self._emit)
        title = QLabel("Conversation settings")
        title.setObjectName("panelTitle")
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(14, 14, 14, 14)
        layout.setSpacing(8)
        layout.addWidget(title)
        layout.addWidget(QLabel("Model"))
        layout.addLayout(model_row)
        layout.addWidget(QLabel("System prompt"))
        layout.addWidget(self.system_prompt)
        layout.addLayout(form)
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

    def set_settings(self, settings: ChatSettings) -> None:
        """Show ``settings`` without emitting settings_changed."""
        self._loading = True
        self.system_prompt.setPlainText(settings.system_prompt)
        for name, box in self.inputs.items():
            box.setValue(getattr(settings, name))
        self._loading = False
        self._timer.stop()

    def set_model(self, text: str) -> None:
        self.model_name.setText(text)

    def settings(self) -> ChatSettings:
        values = {name: box.value() for name, box in self.inputs.items()}
        return dataclasses.replace(ChatSettings(), system_prompt=self.system_prompt.toPlainText(), **values)

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
