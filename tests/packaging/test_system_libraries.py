"""What a Linux bundle carries and leaves to the system, read from the real PySide6's xcb plugin and Qt libraries,
checked against app/platform_check.py's list of the libraries Qt's X11 window needs."""

import pytest

from app.platform_check import PACKAGES, xcb_plugin

from .qt_bundle import carry_like_pyinstaller, qt_bundle

XCB_HELPERS = {"libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-cursor.so.0", "libxcb-image.so.0",
               "libxcb-render-util.so.0", "libxkbcommon-x11.so.0"}  # the ones a minimal desktop lacks
EVERY_SYSTEM = {"libstdc++.so.6", "libgcc_s.so.1", "libz.so.1", "libzstd.so.1"}  # on every Linux, not xcb's


def test_the_xcb_chain_reaches_the_helpers_through_qt(system_libraries, tmp_path):
    chain = system_libraries.xcb_chain(qt_bundle(tmp_path / "b"))
    assert XCB_HELPERS | {"libQt6XcbQpa.so.6", "libxcb.so.1"} <= chain


def test_platform_check_names_every_library_the_window_needs_from_outside_pyside6(system_libraries, tmp_path):
    bundle = qt_bundle(tmp_path / "b")
    outside = system_libraries.xcb_chain(bundle) - system_libraries.carried_names(bundle)
    assert outside - set(PACKAGES) <= system_libraries.GLIBC_SONAMES | EVERY_SYSTEM
    for soname in outside & set(PACKAGES):
        assert system_libraries.debian_package(soname) == PACKAGES[soname][0]


def test_a_bundle_without_the_xcb_helpers_is_caught(system_libraries, tmp_path):
    missing = system_libraries.uncarried_xcb_libraries(qt_bundle(tmp_path / "b"))
    assert XCB_HELPERS <= set(missing)
    assert not set(missing) & system_libraries.LEFT_TO_THE_SYSTEM  # libxcb, GL, EGL and glibc are the system's


def test_a_bundle_carrying_the_chain_leaves_only_the_system_part(system_libraries, tmp_path):
    carry = carry_like_pyinstaller(tmp_path / "probe", system_libraries)
    bundle = qt_bundle(tmp_path / "b", carry=carry)
    assert system_libraries.uncarried_xcb_libraries(bundle) == []
    assert XCB_HELPERS <= set(carry)
    needs = system_libraries.system_needs(bundle)
    assert needs.required <= system_libraries.LEFT_TO_THE_SYSTEM
    assert {"libxcb.so.1", "libGL.so.1"} <= needs.required  # Qt's xcb libraries link both


def test_libraries_only_optional_plugins_load_are_optional(system_libraries, tmp_path):
    bundle = qt_bundle(tmp_path / "b")
    themes = bundle / "_internal" / "PySide6" / "Qt" / "plugins" / "platformthemes"
    themes.mkdir()
    (themes / "libqgtk3.so").symlink_to(xcb_plugin().parent.parent / "platformthemes" / "libqgtk3.so")
    needs = system_libraries.system_needs(bundle)
    assert XCB_HELPERS <= needs.required
    assert "libgtk-3.so.0" in needs.optional and not needs.optional & needs.required


def test_the_glibc_version_is_the_newest_referenced(system_libraries, tmp_path):
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "libone.so.1").write_bytes(b"\x00GLIBC_2.4\x00GLIBC_2.34\x00")
    (bundle / "libtwo.so").write_bytes(b"\x00GLIBC_2.17\x00GLIBC_2.9\x00")
    assert system_libraries.system_needs(bundle).glibc == "2.34"  # by number, not as text ("2.9" > "2.34")


def test_an_unknown_library_is_refused_by_name(system_libraries):
    with pytest.raises(system_libraries.UnknownLibraryError, match="libnothing.so.7"):
        system_libraries.debian_packages(["libxcb.so.1", "libnothing.so.7"])
    assert system_libraries.debian_packages(["libxcb-icccm.so.4", "libc.so.6", "libGL.so.1"]) == ["libgl1",
                                                                                                   "libxcb-icccm4"]
