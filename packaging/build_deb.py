"""Package the built Linux bundle as a .deb: ``python packaging/build_deb.py dist/hearth --out dist``.

The package installs the one-folder bundle as ``/opt/hearth`` (started by ``/usr/bin/hearth``, a link to it), the
menu entry as ``/usr/share/applications/hearth.desktop`` and the icons under ``/usr/share/icons/hicolor``. The
bundle carries Python, Qt and the X11/xcb helper libraries Qt's window needs; ``Depends:`` names the Debian packages
of what it leaves to the system (glibc, libxcb, OpenGL/EGL: they must match the machine's X server and drivers) and
``Recommends:`` those only optional Qt plugins load (the GTK theme, Wayland), all read from the bundle's own ELF
files (system_libraries.py). ``apt install ./hearth_<version>_<arch>.deb`` installs those packages with it.
Built with ``dpkg-deb`` alone (Debian's ``dpkg``), no root needed. Compressed with zstd (dpkg 1.21.18 or later:
Debian 12, Ubuntu 21.10), which the glibc the bundled libraries need asks for anyway, and 2-3 times faster than
gzip for the same size (the model, most of the bytes, does not compress).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL_DIR = "opt/hearth"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
TARBALL_ONLY = ("install.sh", "share")  # the menu entry for an unpacked archive; the package installs its own
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
DESCRIPTION = """\
Run large language models on this computer
 Hearth is a desktop chat app with its own inference engine for GGUF models. It
 ships with a small built-in model (Qwen2.5 Coder 0.5B Instruct) so it chats with
 nothing else to download."""


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"hearth_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


libraries = _load("system_libraries")


def debian_architecture(machine: str) -> str:
    """Debian's name for a CPU as ``uname -m`` gives it."""
    try:
        return ARCHITECTURES[machine]
    except KeyError:
        raise ValueError(f"no Debian architecture is known for the machine {machine!r}") from None


def relations(needs) -> tuple[str, str]:
    """(Depends, Recommends) field values for a bundle's SystemNeeds."""
    depends = [f"libc6 (>= {needs.glibc})"] + libraries.debian_packages(needs.required)
    recommends = [p for p in libraries.debian_packages(needs.optional) if p not in depends]
    return ", ".join(depends), ", ".join(recommends)


def control_text(version: str, architecture: str, installed_kib: int, depends: str, recommends: str) -> str:
    """The DEBIAN/control file."""
    fields = {
        "Package": "hearth", "Version": version, "Architecture": architecture,
        "Maintainer": "Hearth developers <hearth@users.noreply.invalid>", "Installed-Size": str(installed_kib),
        "Depends": depends, "Recommends": recommends, "Section": "utils", "Priority": "optional",
        "Description": DESCRIPTION,
    }
    return "".join(f"{key}: {value}\n" for key, value in fields.items() if value)


def _link_tree(source: Path, target: Path) -> None:
    """Copy a tree as hard links where the file system allows (the bundle is ~700 MB), else as copies."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(source, target, symlinks=True, copy_function=link,
                    ignore=lambda folder, names: [n for n in names if Path(folder) == source and n in TARBALL_ONLY])


def stage(bundle: Path, root: Path) -> None:
    """Lay the package's files out under ``root`` as they will be installed."""
    _link_tree(bundle, root / INSTALL_DIR)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "hearth").symlink_to(f"/{INSTALL_DIR}/hearth")  # the bundle finds _internal/ by realpath
    applications = root / "usr" / "share" / "applications"
    applications.mkdir(parents=True)
    shutil.copy(ROOT / "packaging" / "linux" / "hearth.desktop", applications / "hearth.desktop")
    icons = root / "usr" / "share" / "icons" / "hicolor"
    for size in ICON_SIZES:
        (icons / f"{size}x{size}" / "apps").mkdir(parents=True)
        shutil.copy(ROOT / "resources" / f"hearth-{size}.png", icons / f"{size}x{size}" / "apps" / "hearth.png")
    (icons / "scalable" / "apps").mkdir(parents=True)
    shutil.copy(ROOT / "resources" / "hearth.svg", icons / "scalable" / "apps" / "hearth.svg")
    for path in [root, *root.rglob("*")]:  # readable by everyone whatever the umask was (bits added, none taken)
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
        elif path.is_file() and not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod(mode | 0o444 | (0o111 if mode & 0o100 else 0))


def installed_size_kib(root: Path) -> int:
    return sum((p.stat().st_size + 1023) // 1024 for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def build(bundle: Path, out_dir: Path, version: str, machine: str, compression: str = "zstd") -> Path:
    """Build ``hearth_<version>_<arch>.deb`` in ``out_dir`` from the one-folder bundle; returns its path."""
    if not (bundle / "hearth").is_file():
        raise FileNotFoundError(f"{bundle} holds no hearth executable: build the bundle first (build_linux.sh)")
    architecture = debian_architecture(machine)
    depends, recommends = relations(libraries.system_needs(bundle))
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"hearth_{version}_{architecture}.deb"
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".deb-") as tmp:
        root = Path(tmp) / "root"
        stage(bundle, root)
        (root / "DEBIAN").mkdir(mode=0o755)
        control = control_text(version, architecture, installed_size_kib(root), depends, recommends)
        (root / "DEBIAN" / "control").write_text(control, encoding="utf-8")
        level = [] if compression == "none" else ["-z3" if compression == "zstd" else "-z6"]
        subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", *level, "--build", str(root), str(deb)],
                       check=True, stdout=subprocess.DEVNULL)
    return deb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the one-folder bundle (dist/hearth)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the .deb goes (default: dist/)")
    parser.add_argument("--compression", choices=("gzip", "xz", "zstd", "none"), default="zstd",
                        help="dpkg-deb's compressor (default zstd, read by dpkg 1.21.18 or later; gzip: any dpkg)")
    args = parser.parse_args(argv)
    version = _load("check_bundle").source_version()
    try:
        deb = build(args.bundle.resolve(), args.out.resolve(), version, os.uname().machine, args.compression)
    except (FileNotFoundError, ValueError, subprocess.CalledProcessError) as e:
        print(f"build_deb: {e}", file=sys.stderr)
        return 1
    print(f"deb: {deb} ({deb.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
