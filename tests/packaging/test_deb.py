"""The .deb: built by build_deb.py from a stand-in bundle with dpkg-deb, inspected as check_deb.py does in CI."""

import subprocess

import pytest

from app.platform_check import PACKAGES

from .conftest import ROOT
from .qt_bundle import carry_like_pyinstaller, qt_bundle, system_library_paths

VERSION = "1.2.3"


@pytest.fixture(scope="module")
def carried(system_libraries, tmp_path_factory):
    """What a bundle built on this machine carries of the xcb window's libraries (the xcb helpers, libX11, ...)."""
    return carry_like_pyinstaller(tmp_path_factory.mktemp("probe"), system_libraries)


def make_bundle(path, carry=()):
    bundle = qt_bundle(path, carry=carry, executable="#!/bin/sh\necho hearth\n")
    (bundle / "install.sh").write_text("#!/bin/sh\n")  # the archive's, which the package leaves out
    (bundle / "share").mkdir()
    (bundle / "share" / "hearth.desktop").write_text("[Desktop Entry]\n")
    return bundle


@pytest.fixture(scope="module")
def deb(build_deb, carried, tmp_path_factory):
    bundle = make_bundle(tmp_path_factory.mktemp("bundle") / "hearth", carry=carried)
    return build_deb.build(bundle, tmp_path_factory.mktemp("dist"), VERSION, "x86_64", compression="none")


def test_the_package_is_named_as_debian_names_it(deb):
    assert deb.name == f"hearth_{VERSION}_amd64.deb"


def test_depends_names_what_the_bundle_leaves_to_the_system(check_deb, deb, carried):
    fields = check_deb.fields(deb)
    assert fields["Package"] == "hearth" and fields["Version"] == VERSION and fields["Architecture"] == "amd64"
    declared = check_deb.package_names(fields["Depends"])
    assert {"libc6", "libxcb1", "libgl1"} <= declared
    assert fields["Depends"].startswith("libc6 (>= 2.")
    assert "libxcb-icccm.so.4" in carried and "libX11.so.6" in carried
    assert not {PACKAGES[s][0] for s in carried if s in PACKAGES} & declared  # carried, so not declared
    assert int(fields["Installed-Size"]) > 0 and "Maintainer" in fields
    assert fields["Description"].startswith("Run large language models")


def test_every_library_of_platform_checks_list_is_carried_or_declared(check_deb, deb, tmp_path):
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    bundle = tmp_path / "opt" / "hearth"
    depends = check_deb.fields(deb)["Depends"]
    assert check_deb.xcb_problems(bundle, depends) == []
    reached = check_deb.libraries.xcb_chain(bundle) & set(PACKAGES)
    carried = check_deb.libraries.carried_names(bundle)
    declared = check_deb.package_names(depends)
    assert reached and all(s in carried or PACKAGES[s][0] in declared for s in reached)
    assert [p for p in check_deb.xcb_problems(bundle, "libc6") if "neither in the package" in p]  # it can fail


def test_the_file_list_is_the_bundle_the_launcher_and_the_menu_entry(check_deb, deb):
    assert check_deb.listing_problems(deb) == []
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./usr/bin/hearth -> /opt/hearth/hearth" in listing
    assert "./opt/hearth/install.sh" not in listing and "./opt/hearth/share/" not in listing
    for size in (16, 256, 512):
        assert f"./usr/share/icons/hicolor/{size}x{size}/apps/hearth.png" in listing


def test_a_package_with_the_archives_installer_or_no_launcher_fails(build_deb, check_deb, tmp_path):
    root = tmp_path / "root"
    build_deb.stage(make_bundle(tmp_path / "hearth"), root)
    (root / "opt" / "hearth" / "install.sh").write_text("#!/bin/sh\n")
    (root / "usr" / "bin" / "hearth").unlink()
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(build_deb.control_text(VERSION, "amd64", 1, "libc6", ""))
    bad = tmp_path / "bad.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Znone", "-b", str(root), str(bad)], check=True,
                   capture_output=True)
    problems = check_deb.listing_problems(bad)
    assert any("/usr/bin/hearth is not a link" in p for p in problems)
    assert any("install.sh is the archive's" in p for p in problems)


def test_fields_that_disagree_with_the_bundle_are_reported(check_deb):
    found = {"Package": "hearth", "Version": VERSION, "Depends": "libc6 (>= 2.36), libxcb1", "Recommends": ""}
    assert check_deb.field_problems(found, VERSION, "libc6 (>= 2.36), libxcb1", "") == []
    (problem,) = check_deb.field_problems(found, VERSION, "libc6 (>= 2.36), libgl1, libxcb1", "")
    assert problem.startswith("Depends:") and "libgl1" in problem


def test_the_debian_packages_named_own_the_libraries_here(check_deb):
    """platform_check's Debian column and the .deb's tables against dpkg's own records on this machine."""
    here = system_library_paths()
    names = {s for s in PACKAGES if s in here} | {"libGL.so.1", "libEGL.so.1", "libxcb.so.1"}
    problems, notes = check_deb.owner_problems(names, required=True)
    assert problems == [] and notes == []
    assert {"libxcb-icccm.so.4", "libxcb-cursor.so.0", "libxkbcommon-x11.so.0"} <= names  # CI's apt packages


def test_a_wrong_package_name_is_caught(check_deb, monkeypatch):
    monkeypatch.setitem(check_deb.libraries.MORE_DEBIAN_PACKAGES, "libwayland-client.so.0", "libwayland-server0")
    problems, _ = check_deb.owner_problems({"libwayland-client.so.0"}, required=True)
    assert problems and "not libwayland-server0" in problems[0]


def test_unknown_machines_and_missing_bundles_are_refused(build_deb, tmp_path):
    assert build_deb.debian_architecture("aarch64") == "arm64"
    with pytest.raises(ValueError, match="riscv64"):
        build_deb.debian_architecture("riscv64")
    with pytest.raises(FileNotFoundError, match="no hearth executable"):
        build_deb.build(tmp_path, tmp_path / "dist", VERSION, "x86_64")


def test_the_launcher_and_the_menu_entry_come_from_the_tree(build_deb, tmp_path):
    root = tmp_path / "root"
    build_deb.stage(make_bundle(tmp_path / "hearth"), root)
    desktop = root / "usr" / "share" / "applications" / "hearth.desktop"
    assert desktop.read_bytes() == (ROOT / "packaging" / "linux" / "hearth.desktop").read_bytes()
    assert "Exec=hearth\n" in desktop.read_text()  # /usr/bin/hearth is on PATH
    assert (root / "opt" / "hearth" / "hearth").stat().st_mode & 0o755 == 0o755


def test_dpkg_installs_it_here_and_refuses_a_dependency_this_machine_lacks(build_deb, check_deb, deb, tmp_path):
    assert check_deb.install_problems(deb, tmp_path / "root") == []
    installed = tmp_path / "root" / "opt" / "hearth"
    assert (installed / "hearth").read_text() == "#!/bin/sh\necho hearth\n"
    assert (tmp_path / "root" / "usr" / "bin" / "hearth").readlink().as_posix() == "/opt/hearth/hearth"
    status = (tmp_path / "root" / "var" / "lib" / "dpkg" / "status").read_text()
    assert "Package: hearth\nStatus: install ok installed" in status

    root = tmp_path / "stage"
    build_deb.stage(make_bundle(tmp_path / "hearth"), root)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        build_deb.control_text(VERSION, "amd64", 1, "libc6, hearth-test-no-such-package", ""))
    lacking = tmp_path / "lacking.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Znone", "-b", str(root), str(lacking)], check=True,
                   capture_output=True)
    (problem,) = check_deb.install_problems(lacking, tmp_path / "root2")
    assert "hearth-test-no-such-package" in problem and "is not installed" in problem
