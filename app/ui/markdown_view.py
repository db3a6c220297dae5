"""Renders Markdown as a column of prose blocks (QTextBrowser) and code blocks with syntax colours and a copy
button."""

from __future__ import annotations

import bisect
import math

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (QColor, QDesktopServices, QFont, QFontDatabase, QGuiApplication, QSyntaxHighlighter,
                           QTextCharFormat, QTextDocument)
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QSizePolicy, QTextBrowser, QToolButton,
                               QVBoxLayout, QWidget)

from ..code_highlight import CodeSpan, code_spans
from ..markdown_blocks import Block, split_blocks
from ..qt_compat import emit
from .theme import icon, is_dark

WEB_LINK_SCHEMES = ("http", "https", "mailto")  # what a link in an answer may open; the text is the model's


def open_web_link(url: QUrl) -> bool:
    """Open ``url`` in the browser or mail client if it is a web or mail link; True if it was handed over.

    Links come from the model's answer, so nothing else reaches the desktop: not a URL scheme that starts a
    registered program (``vscode:``, ``smb:``, ``ms-msdt:``), and not a ``file:`` link.
    """
    if url.scheme().lower() not in WEB_LINK_SCHEMES:
        return False
    QDesktopServices.openUrl(url)
    return True


class ProseBlock(QTextBrowser):
    """A borderless, transparent QTextBrowser exactly as tall as its text; wheel events go to the chat scroll.

    Signals:
        none of its own (QTextBrowser's).
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._text = None
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setOpenLinks(False)  # a click only emits anchorClicked: no setSource(file:...), no other handler
        self.anchorClicked.connect(open_web_link)
        self.setObjectName("prose")
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(1)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def set_markdown(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.setMarkdown(text)
            self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit()

    def wheelEvent(self, event) -> None:  # noqa: N802
        event.ignore()

    def minimumSizeHint(self):  # noqa: N802
        hint = super().minimumSizeHint()
        hint.setWidth(40)
        return hint

    def _fit(self, *_) -> None:
        self.document().setTextWidth(self.viewport().width())
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(height)


class CodeHighlighter(QSyntaxHighlighter):
    """Colours a code document from spans computed over its whole text (so strings and comments that run over
    several lines keep their colour); ``set_spans`` before the text changes.

    Signals:
        none of its own.
    """

    def __init__(self, document: QTextDocument):
        super().__init__(document)
        self._spans: list[CodeSpan] = []
        self._starts: list[int] = []

    def set_spans(self, spans: list[CodeSpan]) -> None:
        self._spans, self._starts = spans, [s.start for s in spans]

    def highlightBlock(self, text: str) -> None:  # noqa: N802 - Qt override
        begin = self.currentBlock().position()
        end = begin + len(text)
        index = max(0, bisect.bisect_right(self._starts, begin) - 1)
        for span in self._spans[index:]:
            if span.start >= end:
                break
            start, stop = max(span.start, begin), min(span.start + span.length, end)
            if stop > start:
                self.setFormat(start - begin, stop - start, _char_format(span))


def _char_format(span: CodeSpan) -> QTextCharFormat:
    look = QTextCharFormat()
    look.setForeground(QColor(span.color))
    if span.bold:
        look.setFontWeight(QFont.Weight.Bold)
    look.setFontItalic(span.italic)
    return look


class CodeBlock(QFrame):
    """A code block: a header with the language and a Copy button, then the code in a monospace, unwrapped view.

    Signals:
        copied(str): the code was put on the clipboard.
    """

    copied = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self._language = QLabel()
        self._language.setObjectName("codeLanguage")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.copy_button.setAutoRaise(True)
        self.copy_button.setIcon(icon("copy", "muted"))
        self.copy_button.setToolTip("Copy the code")
        self.copy_button.clicked.connect(self.copy)
        self._reset_copy = QTimer(self, singleShot=True, interval=1500)  # a child: it dies with the block
        self._reset_copy.timeout.connect(lambda: self.copy_button.setText("Copy"))
        header = QHBoxLayout()
        header.setContentsMargins(10, 2, 4, 0)
        header.addWidget(self._language)
        header.addStretch(1)
        header.addWidget(self.copy_button)
        self.code = QPlainTextEdit()
        self.code.setReadOnly(True)
        self.code.setFrameShape(QFrame.Shape.NoFrame)
        self.code.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.code.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.code.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.code.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.code.horizontalScrollBar().rangeChanged.connect(self._fit)
        self.highlighter = CodeHighlighter(self.code.document())
        self._block = Block("code", "")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(1, 1, 1, 1)
        layout.setSpacing(0)
        layout.addLayout(header)
        layout.addWidget(self.code)

    def set_block(self, block: Block) -> None:
        self._language.setText(block.language or "code")
        self._block = block
        if self.code.toPlainText() != block.text:
            self.highlighter.set_spans(self._spans())
            self.code.setPlainText(block.text)
            self._fit()

    def changeEvent(self, event) -> None:  # noqa: N802 - the colours follow a light/dark switch
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.highlighter.set_spans(self._spans())
            self.highlighter.rehighlight()

    def _spans(self) -> list[CodeSpan]:
        return code_spans(self._block.text, self._block.language, is_dark(QGuiApplication.palette()))

    def text(self) -> str:
        return self.code.toPlainText()

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copy_button.setText("Copied")
        self._reset_copy.start()
        emit(self.copied, self.text())

    def _fit(self, *_) -> None:
        lines = max(1, self.code.document().blockCount())
        bar = self.code.horizontalScrollBar()
        scroll = bar.sizeHint().height() if bar.maximum() > 0 else 0  # room for the bar only when lines overflow
        self.code.setFixedHeight(lines * self.code.fontMetrics().lineSpacing()
                                 + 2 * int(self.code.document().documentMargin()) + 4 + scroll)


class MarkdownView(QWidget):
    """A column of ProseBlock and CodeBlock widgets for one Markdown text, reused as the text streams in.

    Signals:
        none.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(8)
        self._blocks: list[tuple[str, QWidget]] = []
        self.markdown = ""

    def set_markdown(self, markdown: str) -> None:
        if markdown == self.markdown:
            return
        self.markdown = markdown
        blocks = split_blocks(markdown)
        for i, block in enumerate(blocks):
            if i < len(self._blocks) and self._blocks[i][0] == block.kind:
                widget = self._blocks[i][1]
            else:
                widget = ProseBlock() if block.kind == "text" else CodeBlock()
                self._replace(i, block.kind, widget)
            if block.kind == "text":
                widget.set_markdown(block.text)
            else:
                widget.set_block(block)
        for _, widget in self._blocks[len(blocks):]:
            self._layout.removeWidget(widget)
            widget.deleteLater()
        del self._blocks[len(blocks):]

    def code_blocks(self) -> list[CodeBlock]:
        return [w for kind, w in self._blocks if kind == "code"]

    def _replace(self, index: int, kind: str, widget: QWidget) -> None:
        if index < len(self._blocks):
            old = self._blocks[index][1]
            self._layout.replaceWidget(old, widget)
            old.deleteLater()
            self._blocks[index] = (kind, widget)
        else:
            self._layout.addWidget(widget)
            self._blocks.append((kind, widget))
