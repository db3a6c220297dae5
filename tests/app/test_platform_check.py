"""The xcb pre-check: missing system libraries are named exactly, with the install commands, before Qt aborts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import platform_check
from app.platform_check import install_message, missing_libraries, needed_sonames, will_use_xcb, xcb_plugin

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin exists on Linux only")


def test_the_plugin_links_the_xcb_libraries_through_qt():
    plugin = xcb_plugin()
    assert plugin is not None
    assert "libQt6XcbQpa.so.6" in needed_sonames(plugin)
    every = set()
    for lib in (plugin.parent.parent.parent / "lib").glob("libQt6XcbQpa.so*"):
        every |= set(needed_sonames(lib))
    assert {"libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0"} <= every


def test_not_an_elf_file_has_no_dependencies(tmp_path):
    (tmp_path / "x.so").write_bytes(b"not an ELF file at all")
    assert needed_sonames(tmp_path / "x.so") == []


def test_each_missing_library_is_named_once():
    hidden = {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    tried = []

    def load(soname: str) -> None:
        tried.append(soname)
        if soname in hidden:
            raise OSError(f"{soname}: cannot open shared object file: No such file or directory")

    missing = missing_libraries(xcb_plugin(), load)
    assert set(missing) == hidden
    assert len(tried) == len(set(tried))  # every soname tried once, however many Qt libraries need it


def test_message_names_libraries_and_the_commands_of_three_package_managers():
    text = install_message({"libxcb-keysyms.so.1": "x", "libxcb-icccm.so.4": "y", "libweird.so.2": "z"})
    assert text.splitlines() == [
        "Hearth cannot open its window: Qt's X11 (xcb) platform needs system libraries that are missing:",
        "  libweird.so.2",
        "  libxcb-icccm.so.4",
        "  libxcb-keysyms.so.1",
        "Install them with your package manager:",
        "  Debian/Ubuntu:  sudo apt install libxcb-icccm4 libxcb-keysyms1",
        "  Fedora:         sudo dnf install xcb-util-wm xcb-util-keysyms",
        "  Arch:           sudo pacman -S xcb-util-wm xcb-util-keysyms",
        "Also install the packages that provide: libweird.so.2",
    ]


@pytest.mark.parametrize("environ, platform, expected", [
    ({}, "linux", True),
    ({"QT_QPA_PLATFORM": "xcb"}, "linux", True),
    ({"QT_QPA_PLATFORM": "offscreen"}, "linux", False),
    ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
    ({"WAYLAND_DISPLAY": "wayland-0", "QT_QPA_PLATFORM": "xcb"}, "linux", True),
    ({}, "darwin", False),
])
def test_the_check_runs_only_where_qt_will_use_xcb(environ, platform, expected):
    assert will_use_xcb(environ, platform) is expected


def test_nothing_missing_means_no_message(monkeypatch):
    monkeypatch.setattr(platform_check, "will_use_xcb", lambda: True)
    assert platform_check.check_xcb(load=lambda soname: None) is None


def test_hearth_exits_with_the_exact_message_when_a_library_is_hidden(tmp_path):
    """A zero-byte stub first on the library path makes libxcb-keysyms unloadable, as a missing package would."""
    (tmp_path / "libxcb-keysyms.so.1").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(LD_LIBRARY_PATH=str(tmp_path), DISPLAY=":99")
    done = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1
    assert done.stderr.strip() == install_message({"libxcb-keysyms.so.1": ""})
    assert not (tmp_path / "data").exists()  # nothing was started or written
