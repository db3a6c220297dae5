"""Build the Windows .ico and macOS .icns from resources/hearth-*.png: ``python packaging/make_icons.py OUTDIR``.

Both formats can hold PNG images as they are (ICO since Windows Vista, ICNS since macOS 10.7), so the files are
assembled with the standard library alone, on any build machine. The 1024 px image macOS wants for its largest
retina slot is rendered from hearth.svg with QtSvg when a size is missing from resources/.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# ICNS element types that hold a PNG, and the pixel size of each (the @2x types are the retina slots).
ICNS_TYPES = (
    (b"icp4", 16), (b"icp5", 32), (b"icp6", 64), (b"ic07", 128), (b"ic08", 256), (b"ic09", 512),
    (b"ic10", 1024), (b"ic11", 32), (b"ic12", 64), (b"ic13", 256), (b"ic14", 512),
)


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk.

    Raises:
        ValueError: the bytes are not a PNG.
    """
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICO file holding each square PNG of ``pngs`` (size → bytes) as one image, smallest first."""
    sizes = sorted(s for s in pngs if s <= 256)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, images = b"", b""
    for size in sizes:
        data = pngs[size]
        # a width or height byte of 0 means 256
        entries += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(data), offset)
        images += data
        offset += len(data)
    return header + entries + images


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICNS file with one element per ICNS_TYPES slot whose pixel size ``pngs`` has."""
    body = b"".join(kind + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
                    for kind, size in ICNS_TYPES if size in pngs)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def read_pngs(directory: Path) -> dict[int, bytes]:
    """The square ``hearth-N.png`` files of ``directory`` by size, each checked against its name."""
    pngs = {}
    for path in sorted(directory.glob("hearth-*.png")):
        data = path.read_bytes()
        width, height = png_size(data)
        if width != height or f"hearth-{width}.png" != path.name:
            raise ValueError(f"{path} is {width}x{height}, not what its name says")
        pngs[width] = data
    return pngs


def render_svg(svg: Path, size: int) -> bytes:
    """``svg`` rendered to a square PNG of ``size`` pixels with QtSvg (offscreen, no window)."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])  # noqa: F841 - QImage painting needs it
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data)


def make_icons(out_dir: Path, resources: Path = RESOURCES, render_missing: bool = True) -> tuple[Path, Path]:
    """Write ``hearth.ico`` and ``hearth.icns`` into ``out_dir``; returns their paths."""
    pngs = read_pngs(resources)
    if not pngs:
        raise FileNotFoundError(f"no hearth-*.png icons in {resources}")
    if render_missing and 1024 not in pngs and (resources / "hearth.svg").is_file():
        pngs[1024] = render_svg(resources / "hearth.svg", 1024)
    out_dir.mkdir(parents=True, exist_ok=True)
    ico, icns = out_dir / "hearth.ico", out_dir / "hearth.icns"
    ico.write_bytes(ico_bytes({s: d for s, d in pngs.items() if s in ICO_SIZES}))
    icns.write_bytes(icns_bytes(pngs))
    return ico, icns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--resources", type=Path, default=RESOURCES, help="where hearth-*.png and hearth.svg are")
    parser.add_argument("--no-render", action="store_true", help="use the PNG files only (no QtSvg)")
    args = parser.parse_args(argv)
    for path in make_icons(args.out_dir, args.resources, render_missing=not args.no_render):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
