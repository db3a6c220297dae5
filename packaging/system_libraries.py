"""Which shared libraries a built Linux bundle carries and which it leaves to the system, with Debian's package names.

Standard library plus ``app.platform_check`` (its ELF reader and its soname -> package table, the list ``hearth``
names to a person whose xcb libraries are missing), so the .deb's ``Depends:``, check_bundle.py and the tests read
the same facts. A library counts as carried when a file of that name is anywhere in the bundle: PyInstaller puts the
libraries it collects in ``_internal/`` (on the loader's path) and Qt's own in ``PySide6/Qt/lib`` (Qt's RPATH).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # loaded by path (build_deb.py, check_bundle.py, the tests), from any directory
    sys.path.insert(0, str(ROOT))
from app.platform_check import PACKAGES, needed_sonames  # noqa: E402 - after the path is set

XCB_PLUGIN = "_internal/PySide6/Qt/plugins/platforms/libqxcb.so"
# glibc: never bundled, every system has it; the version a bundle needs is read from its symbol references.
GLIBC_SONAMES = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                           "libresolv.so.2", "libutil.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"})
# What PyInstaller leaves out on purpose (they must match the system's X server and graphics drivers), so the bundle
# declares them rather than carrying them; everything else Qt's xcb plugin needs has to be inside.
LEFT_TO_THE_SYSTEM = frozenset({"libxcb.so.1", "libGL.so.1", "libEGL.so.1", "libOpenGL.so.0", "libGLX.so.0",
                                "libdrm.so.2"}) | GLIBC_SONAMES
# Debian packages of the system libraries platform_check's table does not name: glibc, the rest of the graphics
# stack, the C++ runtime and compressors Qt links, and what the optional GTK theme and Wayland plugins link.
MORE_DEBIAN_PACKAGES = {
    **{soname: "libc6" for soname in GLIBC_SONAMES},
    "libOpenGL.so.0": "libopengl0", "libGLX.so.0": "libglx0", "libdrm.so.2": "libdrm2",
    "libstdc++.so.6": "libstdc++6", "libgcc_s.so.1": "libgcc-s1", "libz.so.1": "zlib1g", "libzstd.so.1": "libzstd1",
    "libgtk-3.so.0": "libgtk-3-0", "libgdk-3.so.0": "libgtk-3-0",
    "libwayland-client.so.0": "libwayland-client0", "libwayland-cursor.so.0": "libwayland-cursor0",
    "libwayland-egl.so.1": "libwayland-egl1",
}
GLIBC_VERSION = re.compile(rb"GLIBC_(2\.\d+)\x00")
ELF_NAME = re.compile(r"(\.so(\.[\w.]*)?|^hearth)$")


class UnknownLibraryError(ValueError):
    """The bundle needs a system library whose Debian package is not in the tables."""


class SystemNeeds(NamedTuple):  # no dataclass: this module is loaded by path, outside sys.modules
    """What a bundle needs from the system: sonames it does not carry, split by whether starting needs them."""

    required: frozenset[str]  # the executable, the Python extensions and Qt's xcb window need these
    optional: frozenset[str]  # only optional plugins do (the GTK theme, Wayland)
    glibc: str  # the newest GLIBC_ symbol version any file refers to, e.g. "2.34"


def elf_files(bundle: Path) -> list[Path]:
    """Every shared object and the executable in the bundle, once each (the links PyInstaller adds beside Qt's
    libraries resolve to the same file)."""
    return sorted({p.resolve() for p in bundle.rglob("*") if p.is_file() and ELF_NAME.search(p.name)})


def carried_names(bundle: Path) -> set[str]:
    """The file names in the bundle, symlinks included: the sonames it carries."""
    return {p.name for p in bundle.rglob("*") if p.is_file()}


def closure(roots: Iterable[Path], bundle: Path) -> set[str]:
    """Every soname reached from ``roots`` through the libraries the bundle carries (the carried and the missing)."""
    by_name = {path.name: path for path in bundle.rglob("*") if path.is_file()}  # a link reads as its target
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        for soname in needed_sonames(todo.pop()):
            if soname not in seen:
                seen.add(soname)
                if soname in by_name:
                    todo.append(by_name[soname])
    return seen


def system_needs(bundle: Path) -> SystemNeeds:
    """Split what the bundle's files need and it does not carry into required and optional."""
    files = elf_files(bundle)
    carried = carried_names(bundle)
    # Required: the executable, Python's extension modules and what they load, and the xcb platform plugin; Qt's
    # libraries in PySide6/Qt/lib count only when those reach them (libQt6WaylandClient does not).
    roots = [p for p in files if p.name == "hearth" or re.search(r"\.(cpython-[^/]*|abi3)\.so$", p.name)]
    roots += [bundle / XCB_PLUGIN] if (bundle / XCB_PLUGIN).is_file() else []
    required = closure(roots, bundle) - carried
    everything = closure(files, bundle) - carried
    glibc = max((m.decode() for p in files for m in GLIBC_VERSION.findall(p.read_bytes())),
                key=lambda v: tuple(int(x) for x in v.split(".")), default="2.17")
    return SystemNeeds(frozenset(required), frozenset(everything - required), glibc)


def xcb_chain(bundle: Path) -> set[str]:
    """Every soname Qt's xcb platform plugin in the bundle reaches: the libraries a window on X11 needs."""
    return closure([bundle / XCB_PLUGIN], bundle)


def debian_package(soname: str) -> str:
    """Debian's package for a system library: platform_check's table first, then this module's."""
    if soname in PACKAGES:
        return PACKAGES[soname][0]
    if soname in MORE_DEBIAN_PACKAGES:
        return MORE_DEBIAN_PACKAGES[soname]
    raise UnknownLibraryError(f"no Debian package is known for {soname}: add it to app/platform_check.py's "
                              "PACKAGES (a library the xcb window needs) or to packaging/system_libraries.py")


def debian_packages(sonames: Iterable[str]) -> list[str]:
    """The sorted, distinct Debian packages of ``sonames`` (glibc's libraries are libc6, handled by the caller)."""
    return sorted({debian_package(s) for s in sonames if s not in GLIBC_SONAMES})


def uncarried_xcb_libraries(bundle: Path) -> list[str]:
    """Libraries the xcb plugin needs that the bundle should carry but does not (the build machine lacked them)."""
    return sorted(xcb_chain(bundle) - carried_names(bundle) - LEFT_TO_THE_SYSTEM)
