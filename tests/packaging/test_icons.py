"""The .ico and .icns made from resources/hearth-*.png hold every size, each as a PNG of that size."""

import os
import shutil
import struct
import subprocess
import sys

import pytest

from .conftest import PACKAGING, ROOT


def parse_ico(data: bytes) -> list[tuple[int, bytes]]:
    reserved, kind, count = struct.unpack_from("<HHH", data, 0)
    assert (reserved, kind) == (0, 1)
    images = []
    for i in range(count):
        width, height, _, _, planes, bits, size, offset = struct.unpack_from("<BBBBHHII", data, 6 + 16 * i)
        assert width == height and planes == 1 and bits == 32
        assert offset + size <= len(data)
        images.append((width or 256, data[offset:offset + size]))
    return images


def parse_icns(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:4] == b"icns" and struct.unpack(">I", data[4:8])[0] == len(data)
    elements, at = [], 8
    while at < len(data):
        kind, length = data[at:at + 4], struct.unpack(">I", data[at + 4:at + 8])[0]
        assert length > 8 and at + length <= len(data)
        elements.append((kind, data[at + 8:at + length]))
        at += length
    return elements


def test_ico_and_icns_from_the_resources(tmp_path, make_icons):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    subprocess.run([sys.executable, str(PACKAGING / "make_icons.py"), str(tmp_path)], env=env, check=True,
                   capture_output=True, timeout=120)
    ico = parse_ico((tmp_path / "hearth.ico").read_bytes())
    assert [size for size, _ in ico] == [16, 24, 32, 48, 64, 128, 256]
    for size, png in ico:
        assert make_icons.png_size(png) == (size, size)
        assert png == (ROOT / "resources" / f"hearth-{size}.png").read_bytes()
    icns = dict(parse_icns((tmp_path / "hearth.icns").read_bytes()))
    expected = {b"icp4": 16, b"icp5": 32, b"icp6": 64, b"ic07": 128, b"ic08": 256, b"ic09": 512, b"ic10": 1024,
                b"ic11": 32, b"ic12": 64, b"ic13": 256, b"ic14": 512}
    assert {kind: make_icons.png_size(png)[0] for kind, png in icns.items()} == expected


def test_without_rendering_the_1024_slot_is_left_out(tmp_path, make_icons):
    ico, icns = make_icons.make_icons(tmp_path, render_missing=False)
    kinds = [kind for kind, _ in parse_icns(icns.read_bytes())]
    assert b"ic10" not in kinds and b"ic09" in kinds
    assert len(parse_ico(ico.read_bytes())) == 7


def test_a_png_whose_size_contradicts_its_name_is_refused(tmp_path, make_icons):
    shutil.copy(ROOT / "resources" / "hearth-32.png", tmp_path / "hearth-48.png")
    with pytest.raises(ValueError, match="not what its name says"):
        make_icons.read_pngs(tmp_path)


def test_not_a_png(make_icons):
    with pytest.raises(ValueError, match="not a PNG"):
        make_icons.png_size(b"GIF89a" + bytes(30))


def test_no_icons_at_all(tmp_path, make_icons):
    with pytest.raises(FileNotFoundError):
        make_icons.make_icons(tmp_path / "out", resources=tmp_path)
