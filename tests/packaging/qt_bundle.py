"""Stand-in Linux bundles around the installed PySide6's real xcb plugin and Qt libraries (as symlinks, no copies)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from app.platform_check import xcb_plugin

QT_LIBRARIES = re.compile(r"libQt6(Core|Gui|Widgets|DBus|XcbQpa)\.so\.6|libicu\w+\.so\.\d+")


def system_library_paths() -> dict[str, str]:
    """soname -> path of this machine's x86-64/AArch64 libraries, from ``ldconfig -p``."""
    text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    paths: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.strip().partition(" (")
        if ("x86-64" in rest or "AArch64" in rest) and " => " in rest:
            paths.setdefault(name, rest.split(" => ")[1])
    return paths


def qt_bundle(root: Path, carry: tuple[str, ...] = (), executable: str | None = None) -> Path:
    """A bundle laid out as PyInstaller does: ``_internal/PySide6/Qt/{lib,plugins/platforms/libqxcb.so}``.

    ``carry``: sonames of this machine's libraries to put in ``_internal/`` (as PyInstaller collects them).
    ``executable``: the text of a ``hearth`` script (none by default).
    """
    plugin = xcb_plugin()
    assert plugin is not None, "PySide6 has no xcb platform plugin"
    qt = plugin.parent.parent.parent
    internal = root / "_internal"
    platforms = internal / "PySide6" / "Qt" / "plugins" / "platforms"
    platforms.mkdir(parents=True)
    (platforms / "libqxcb.so").symlink_to(plugin)
    (internal / "PySide6" / "Qt" / "lib").mkdir()
    for lib in (qt / "lib").glob("lib*.so*"):  # what the xcb window reaches of Qt, and its ICU
        if not QT_LIBRARIES.fullmatch(lib.name):
            continue
        (internal / "PySide6" / "Qt" / "lib" / lib.name).symlink_to(lib)
    system = system_library_paths()
    for soname in carry:
        (internal / soname).symlink_to(system[soname])
    if executable is not None:
        (root / "hearth").write_text(executable)
        (root / "hearth").chmod(0o755)
    return root


def carry_like_pyinstaller(path: Path, system_libraries) -> tuple[str, ...]:
    """The sonames a bundle built here carries for the xcb window: what the chain needs from this machine, then
    what those need, and so on (as PyInstaller collects them), except what it leaves to the system."""
    here, carry = system_library_paths(), set()
    for attempt in range(12):
        bundle = qt_bundle(path / str(attempt), carry=tuple(sorted(carry)))
        more = set(system_libraries.uncarried_xcb_libraries(bundle)) & set(here)
        if not more:
            return tuple(sorted(carry))
        carry |= more
    raise AssertionError("the xcb chain kept growing")
