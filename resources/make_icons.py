"""Render resources/hearth.svg to the PNG sizes desktops and installers ask for: python resources/make_icons.py"""

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def main() -> int:
    app = QGuiApplication(sys.argv)  # noqa: F841 - image rendering needs the GUI application object
    here = Path(__file__).resolve().parent
    renderer = QSvgRenderer(str(here / "hearth.svg"))
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        image.save(str(here / f"hearth-{size}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
