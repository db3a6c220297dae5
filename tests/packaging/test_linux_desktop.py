"""The Linux desktop entry and install.sh, which points it at the unpacked bundle."""

import configparser
import os
import shutil
import subprocess

import pytest

from .conftest import PACKAGING, ROOT

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def read_desktop(path):
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def test_desktop_entry_names_the_app_and_its_icon():
    entry = read_desktop(PACKAGING / "linux" / "hearth.desktop")
    assert entry["Type"] == "Application" and entry["Name"] == "Hearth"
    assert entry["Exec"] == "hearth" and entry["TryExec"] == "hearth"
    assert entry["Icon"] == "hearth" and entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";")


@pytest.fixture
def unpacked(tmp_path):
    """A stand-in for the unpacked bundle, laid out as build_linux.sh leaves it, in a path with a space and &."""
    bundle = tmp_path / "R&D apps" / "hearth-0.1.0"
    (bundle / "share" / "icons").mkdir(parents=True)
    (bundle / "hearth").write_text("#!/bin/sh\nexit 0\n")
    (bundle / "hearth").chmod(0o755)
    shutil.copy(PACKAGING / "linux" / "hearth.desktop", bundle / "share")
    for path in [ROOT / "resources" / "hearth.svg"] + [ROOT / "resources" / f"hearth-{s}.png" for s in SIZES]:
        shutil.copy(path, bundle / "share" / "icons")
    shutil.copy(PACKAGING / "linux" / "install.sh", bundle / "install.sh")
    return bundle


def run_install(bundle, home, *args):
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "XDG_DATA_HOME": str(home / "data")}
    return subprocess.run(["sh", str(bundle / "install.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_install_points_the_menu_entry_at_the_bundle_and_uninstall_removes_it(unpacked, tmp_path):
    home = tmp_path / "home"
    result = run_install(unpacked, home)
    assert result.returncode == 0, result.stderr
    data = home / "data"
    entry = read_desktop(data / "applications" / "hearth.desktop")
    assert entry["Exec"] == f'"{unpacked}/hearth"'
    assert entry["TryExec"] == f"{unpacked}/hearth"
    assert entry["Icon"] == "hearth"
    for size in SIZES:
        installed = data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "hearth.png"
        assert installed.read_bytes() == (ROOT / "resources" / f"hearth-{size}.png").read_bytes()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "hearth.svg").is_file()

    result = run_install(unpacked, home, "--uninstall")
    assert result.returncode == 0, result.stderr
    assert not (data / "applications" / "hearth.desktop").exists()
    assert not list((data / "icons").rglob("hearth.*"))
    assert (unpacked / "hearth").is_file()


def test_install_refuses_a_folder_without_the_bundle(tmp_path):
    shutil.copy(PACKAGING / "linux" / "install.sh", tmp_path / "install.sh")
    result = run_install(tmp_path, tmp_path / "home")
    assert result.returncode == 1 and "unpacked Hearth folder" in result.stderr
    assert not (tmp_path / "home" / "data" / "applications").exists()


def test_install_refuses_a_path_the_desktop_entry_cannot_quote(unpacked, tmp_path):
    odd = unpacked.parent / 'say "hi"'
    unpacked.rename(odd)
    result = run_install(odd, tmp_path / "home")
    assert result.returncode == 1 and "quote" in result.stderr
