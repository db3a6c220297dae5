"""Look and feel from the OS palette (light or dark): one app style sheet, palette-tinted icons, the app icon."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QIconEngine, QImage, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QWidget

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
# A page's column of labels and fields stops growing here (logical pixels): a form stretched across a wide window
# puts each label far from its field and makes a spin box as wide as a paragraph.
MAX_CONTENT_WIDTH = 640
NOTICE_COLORS = {"info": "#2f7dd1", "warning": "#c98a00", "error": "#c5322a"}


def app_icon() -> QIcon:
    """Hearth's window icon from the rendered PNG sizes (the SVG alone when they are missing)."""
    icon = QIcon()
    for size in ICON_SIZES:
        png = RESOURCES / f"hearth-{size}.png"
        if png.exists():
            icon.addFile(str(png), QSize(size, size))
    if icon.isNull() and (RESOURCES / "hearth.svg").exists():
        icon.addFile(str(RESOURCES / "hearth.svg"))
    return icon


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """``a`` moved a fraction ``t`` towards ``b``."""
    return QColor(round(a.red() + (b.red() - a.red()) * t), round(a.green() + (b.green() - a.green()) * t),
                  round(a.blue() + (b.blue() - a.blue()) * t))


def tone(palette: QPalette, name: str) -> QColor:
    """A named colour derived from the palette: text, muted, on_accent."""
    window, text = palette.color(QPalette.ColorRole.Window), palette.color(QPalette.ColorRole.WindowText)
    if name == "muted":
        return mix(window, text, 0.55)
    if name == "on_accent":
        return palette.color(QPalette.ColorRole.HighlightedText)
    return text


class TintedSvgIconEngine(QIconEngine):
    """Draws a monochrome SVG in a colour taken from the application palette at paint time.

    So icons follow a light/dark switch without anyone re-creating them.
    """

    def __init__(self, name: str, tone_name: str):
        super().__init__()
        self.name, self.tone_name = name, tone_name
        self.renderer = QSvgRenderer(str(RESOURCES / "icons" / f"{name}.svg"))
        self._pixmaps: dict[tuple, QPixmap] = {}  # (width, height, scale, colour) -> the icon drawn so

    def paint(self, painter: QPainter, rect: QRect, mode: QIcon.Mode, state: QIcon.State) -> None:
        scale = painter.device().devicePixelRatioF() if painter.device() else 1.0
        painter.drawPixmap(rect, self._render(rect.size(), mode, scale))

    def pixmap(self, size: QSize, mode: QIcon.Mode, state: QIcon.State) -> QPixmap:
        return self._render(size, mode, 1.0)

    def scaledPixmap(self, size: QSize, mode: QIcon.Mode, state: QIcon.State, scale: float) -> QPixmap:  # noqa: N802
        return self._render(size, mode, scale)

    def clone(self) -> QIconEngine:
        return TintedSvgIconEngine(self.name, self.tone_name)

    def _render(self, size: QSize, mode: QIcon.Mode, scale: float) -> QPixmap:
        palette = QGuiApplication.palette()
        color = tone(palette, self.tone_name)
        if mode == QIcon.Mode.Disabled:
            color = mix(palette.color(QPalette.ColorRole.Window), color, 0.4)
        w, h = max(1, round(size.width() * scale)), max(1, round(size.height() * scale))
        key = (w, h, scale, color.rgba())
        if key not in self._pixmaps:  # every paint of every button asks again: drawing the SVG each time is slow
            self._pixmaps[key] = self._draw(w, h, scale, color)
        return self._pixmaps[key]

    def _draw(self, w: int, h: int, scale: float, color: QColor) -> QPixmap:
        image = QImage(w, h, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.renderer.render(painter, QRectF(0, 0, w, h))
        painter.setCompositionMode(QPainter.CompositionMode.CompositionMode_SourceIn)
        painter.fillRect(image.rect(), color)
        painter.end()
        pixmap = QPixmap.fromImage(image)
        pixmap.setDevicePixelRatio(scale)
        return pixmap


_engines: dict[tuple[str, str], QIcon] = {}  # QIcon keeps a C++ pointer to the Python engine: keep both alive


def icon(name: str, tone_name: str = "text") -> QIcon:
    """The icon resources/icons/NAME.svg drawn in the palette tone ``text``, ``muted`` or ``on_accent``."""
    key = (name, tone_name)
    if key not in _engines:
        engine = TintedSvgIconEngine(name, tone_name)
        _engines[key] = (engine, QIcon(engine))
    return _engines[key][1]


def style_sheet(palette: QPalette) -> str:
    """Hearth's style sheet: only colours derived from ``palette`` and a few shapes, keyed by object name."""
    window, text = palette.color(QPalette.ColorRole.Window), palette.color(QPalette.ColorRole.WindowText)
    base, accent = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Highlight)
    dark = is_dark(palette)
    c = {
        "rail": mix(window, text, 0.08), "side": mix(window, text, 0.04), "line": mix(window, text, 0.14),
        "window": window, "card_line": mix(window, text, 0.1),
        "checked": mix(mix(window, text, 0.08), accent, 0.3), "selected": mix(window, accent, 0.25),
        "bubble": mix(window, accent, 0.18 if dark else 0.09), "muted": tone(palette, "muted"),
        "code": mix(base, text, 0.05), "code_line": mix(base, text, 0.15), "base": base, "accent": accent,
        "box_line": mix(base, text, 0.22), "text": text, "error": QColor("#ff8a80" if dark else "#b3261e"),
    }
    for kind, color in NOTICE_COLORS.items():
        c[f"notice_{kind}"] = mix(window, QColor(color), 0.28 if dark else 0.14)
    n = {k: v.name() for k, v in c.items()}
    sheet = f"""
        #rail {{ background: {n['rail']}; }}
        #rail QToolButton {{ border: none; border-radius: 8px; padding: 6px 2px; }}
        #rail QToolButton:checked {{ background: {n['checked']}; }}
        #chatTitle {{ font-size: 13pt; font-weight: 600; }}
        #pageTitle {{ font-size: 18pt; font-weight: 600; }}
        #panelTitle, #author {{ font-weight: 600; }}
        #sidebar {{ background: {n['side']}; border-right: 1px solid {n['line']}; }}
        #settingsPanel {{ border-left: 1px solid {n['line']}; }}
        #conversationList {{ background: transparent; }}
        #conversationList::item {{ padding: 0 8px; border-radius: 6px; color: {n['text']}; }}
        #conversationList::item:selected {{ background: {n['selected']}; }}
        #modelList::item {{ padding: 8px 6px; }}
        #userMessage {{ background: {n['bubble']}; border-radius: 10px; }}
        #stats, #meterLabel, #codeLanguage, #emptyState {{ color: {n['muted']}; }}
        #dashboardBody {{ background: {n['window']}; }}
        #chartCard {{ background: {n['base']}; border: 1px solid {n['card_line']}; border-radius: 8px; }}
        #cardTitle {{ font-weight: 600; }}
        #cardLegend, #stripItem {{ color: {n['muted']}; }}
        #messageError {{ color: {n['error']}; }}
        QTextBrowser#prose {{ background: transparent; }}
        #thinkingBlock {{ border: none; border-left: 2px solid {n['box_line']}; padding-left: 6px; }}
        #thinkingToggle {{ border: none; background: transparent; padding: 1px 0; }}
        #thinkingToggle, #thinkingBlock QTextBrowser#prose {{ color: {n['muted']}; }}
        #codeBlock {{ background: {n['code']}; border: 1px solid {n['code_line']}; border-radius: 6px; }}
        #codeBlock QPlainTextEdit {{ background: transparent; }}
        #codeBlock QScrollBar:horizontal {{ background: {n['code']}; height: 8px; margin: 0 4px 2px 4px; border: none; }}
        #codeBlock QScrollBar::handle:horizontal {{ background: {n['code_line']}; border-radius: 3px; min-width: 24px; }}
        #codeBlock QScrollBar::handle:horizontal:hover {{ background: {n['muted']}; }}
        #codeBlock QScrollBar::add-line, #codeBlock QScrollBar::sub-line {{ width: 0; border: none; }}
        #codeBlock QScrollBar::add-page, #codeBlock QScrollBar::sub-page {{ background: none; }}
        #composerBox {{ background: {n['base']}; border: 1px solid {n['box_line']}; border-radius: 12px; }}
        #composerBox QPlainTextEdit {{ background: transparent; }}
        #sendButton {{ background: {n['accent']}; border: none; border-radius: 18px; }}
        #sendButton:disabled {{ background: {n['box_line']}; }}
    """
    for kind, color in NOTICE_COLORS.items():
        sheet += (f"#noticeBar[kind=\"{kind}\"] {{ background: {n['notice_' + kind]};"
                  f" border-left: 3px solid {color}; border-radius: 6px; }}\n")
    return sheet


class ThemeKeeper(QObject):
    """Keeps the app style sheet in step with the palette: re-derives it when the OS switches light/dark.

    Signals:
        none.
    """

    def __init__(self, app: QApplication):
        super().__init__(app)
        self.app = app
        self._sheet = ""
        self.apply()
        # Qt tells every widget when the application palette changes: one never shown is watched, not the whole
        # application (a filter on it ran Python, taking the GIL, for every event of every object)
        self._watched = QWidget()
        self._watched.installEventFilter(self)

    def apply(self) -> None:
        sheet = style_sheet(self.app.palette())
        if sheet != self._sheet:
            self._sheet = sheet
            self.app.setStyleSheet(sheet)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        if watched is self._watched and event.type() == QEvent.Type.ApplicationPaletteChange:
            self.apply()
        return False


def dark_palette() -> QPalette:
    """A dark palette for platforms whose theme reports dark mode but gives Qt no dark colours."""
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: "#1f1f23", QPalette.ColorRole.WindowText: "#e6e6e9",
        QPalette.ColorRole.Base: "#17171a", QPalette.ColorRole.AlternateBase: "#26262b",
        QPalette.ColorRole.Text: "#e6e6e9", QPalette.ColorRole.Button: "#2a2a30",
        QPalette.ColorRole.ButtonText: "#e6e6e9", QPalette.ColorRole.Highlight: "#d9692b",
        QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.ToolTipBase: "#2a2a30",
        QPalette.ColorRole.ToolTipText: "#e6e6e9", QPalette.ColorRole.PlaceholderText: "#8b8b93",
        QPalette.ColorRole.Link: "#f0a05a", QPalette.ColorRole.Mid: "#3a3a42", QPalette.ColorRole.Dark: "#101012",
        QPalette.ColorRole.Light: "#3c3c44", QPalette.ColorRole.Midlight: "#34343b",
        QPalette.ColorRole.BrightText: "#ffffff", QPalette.ColorRole.Shadow: "#000000",
    }
    for role, color in roles.items():
        p.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6c6c74"))
    return p


def apply_color_scheme(app: QApplication, scheme: str) -> None:
    """Follow the OS ("auto"), or force "light" or "dark" (Fusion style, Hearth's dark palette)."""
    hints = app.styleHints()
    if scheme == "dark" or (scheme == "auto" and hints.colorScheme() == Qt.ColorScheme.Dark
                            and not is_dark(app.palette())):
        app.setStyle("Fusion")
        app.setPalette(dark_palette())
    elif scheme == "light":
        app.setStyle("Fusion")
