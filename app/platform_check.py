"""Before Qt starts on Linux: are the system libraries its X11 (xcb) platform plugin links against loadable?

Qt's own message for a missing xcb library names ``libxcb-cursor0`` whatever is missing, then aborts. This check reads
the plugin's ELF dependency list (and that of the Qt libraries beside it), tries to load every system library it
names, and reports exactly which are missing with the install command for apt, dnf and pacman.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

# soname -> (Debian/Ubuntu, Fedora, Arch) package
PACKAGES: dict[str, tuple[str, str, str]] = {
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
}
for _ext in ("randr", "shm", "sync", "xfixes", "render", "shape", "xkb", "xinerama", "glx", "xinput"):
    _so = f"libxcb-{_ext}.so.{1 if _ext in ('sync', 'xkb') else 0}"
    PACKAGES.setdefault(_so, (f"libxcb-{_ext}{1 if _ext in ('sync', 'xkb') else 0}", "libxcb", "libxcb"))

Loader = Callable[[str], None]  # loads a library by soname; raises OSError when it cannot


def needed_sonames(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object (empty for anything else)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + off) for off in range(0, dynamic[1], 16)]
    strtab = next((value for tag, value in entries if tag == 5), None)
    if strtab is None:
        return []
    base = next((offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return []
    return [data[base + value:data.index(b"\0", base + value)].decode() for tag, value in entries if tag == 1]


def _ctypes_loader(soname: str) -> None:
    ctypes.CDLL(soname)


def missing_libraries(plugin: Path, load: Loader = _ctypes_loader) -> dict[str, str]:
    """System libraries the plugin (and the Qt libraries it pulls from beside it) cannot load: soname -> reason."""
    qt_lib = plugin.parent.parent.parent / "lib"  # PySide6/Qt/plugins/platforms -> PySide6/Qt/lib
    missing: dict[str, str] = {}
    seen: set[str] = set()
    todo = [plugin]
    while todo:
        for soname in needed_sonames(todo.pop()):
            if soname in seen:
                continue
            seen.add(soname)
            bundled = qt_lib / soname
            if bundled.exists():
                todo.append(bundled)
                continue
            try:
                load(soname)
            except OSError as e:
                missing[soname] = str(e)
    return missing


def install_message(missing: dict[str, str]) -> str:
    """What to tell the person: the missing libraries and the command that installs them on each family."""
    lines = ["Hearth cannot open its window: Qt's X11 (xcb) platform needs system libraries that are missing:"]
    lines += [f"  {soname}" for soname in sorted(missing)]
    known = [PACKAGES[s] for s in sorted(missing) if s in PACKAGES]
    unknown = [s for s in sorted(missing) if s not in PACKAGES]
    if known:
        lines.append("Install them with your package manager:")
        for label, command, column in (("Debian/Ubuntu", "sudo apt install", 0), ("Fedora", "sudo dnf install", 1),
                                       ("Arch", "sudo pacman -S", 2)):
            names = " ".join(dict.fromkeys(p[column] for p in known))
            lines.append(f"  {label + ':':15} {command} {names}")
    if unknown:
        lines.append("Also install the packages that provide: " + ", ".join(unknown))
    return "\n".join(lines)


def xcb_plugin() -> Path | None:
    """Qt's xcb platform plugin in the installed PySide6, if there is one."""
    try:
        import PySide6  # the package's __init__ only: no Qt library is loaded yet
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.exists() else None


def will_use_xcb(environ: dict[str, str] | os._Environ = os.environ, platform: str = sys.platform) -> bool:
    """Whether Qt will start on the xcb plugin: Linux, and no other platform asked for or a Wayland session."""
    if not platform.startswith("linux"):
        return False
    asked = environ.get("QT_QPA_PLATFORM", "")
    if asked:
        return asked.split(":")[0].split(";")[0] == "xcb"
    return not environ.get("WAYLAND_DISPLAY")


def check_xcb(load: Loader = _ctypes_loader) -> str | None:
    """None when Qt's window can start, else the message to print before exiting non-zero."""
    plugin = xcb_plugin() if will_use_xcb() else None
    if plugin is None:
        return None
    missing = missing_libraries(plugin, load)
    return install_message(missing) if missing else None
