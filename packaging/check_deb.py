"""Check a built .deb before it ships: ``python packaging/check_deb.py dist/hearth_<v>_<arch>.deb --root DIR``.

- its control fields: package ``hearth``, ``engine.__version__`` of this tree, Depends/Recommends equal to what the
  packaged bundle's own ELF files need from the system (system_libraries.py);
- every library of ``app/platform_check.py``'s list that Qt's xcb window reaches is carried in the package or its
  Debian package is in ``Depends:``, and nothing else the window needs is missing;
- on this Debian machine, each declared library's file belongs to the package named for it (``dpkg -S``): the
  soname -> package tables are right, and what ``Depends:`` names is installed here;
- the file list: the bundle under /opt/hearth, /usr/bin/hearth linking to it, the menu entry and icons, owned by
  root, and not the archive's own install.sh.
- it installs with ``dpkg -i`` into a throwaway root whose package database is a copy of this machine's, so dpkg
  itself checks ``Depends:`` against what is installed here (``--root DIR`` keeps that root for the smoke test that
  follows in CI: ``DIR/opt/hearth/hearth``).
Exits 1 with the reasons when a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REQUIRED_PATHS = ("./opt/hearth/hearth", "./usr/share/applications/hearth.desktop",
                  "./usr/share/icons/hicolor/scalable/apps/hearth.svg",
                  "./usr/share/icons/hicolor/256x256/apps/hearth.png")
LAUNCHER = ("./usr/bin/hearth", "/opt/hearth/hearth")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"hearth_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_deb = _load("build_deb")
libraries = build_deb.libraries


def fields(deb: Path) -> dict[str, str]:
    """The control fields of a .deb (``dpkg-deb -f``), continuation lines joined."""
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    result: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and key:
            result[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            result[key] = value.strip()
    return result


def package_names(relation: str) -> set[str]:
    """The package names of a Depends-style field, without versions or architectures."""
    return {re.split(r"[\s(:]", part.strip(), maxsplit=1)[0] for part in relation.split(",") if part.strip()}


def field_problems(found: dict[str, str], version: str, expected_depends: str, expected_recommends: str) -> list[str]:
    problems = []
    for key, want in (("Package", "hearth"), ("Version", version), ("Depends", expected_depends),
                      ("Recommends", expected_recommends)):
        if found.get(key, "") != want:
            problems.append(f"{key}: is {found.get(key, '')!r}, the bundle inside calls for {want!r}")
    return problems


def xcb_problems(bundle: Path, depends: str) -> list[str]:
    """platform_check's libraries that the xcb window reaches, neither carried nor declared; and any uncarried one."""
    declared = package_names(depends)
    carried = libraries.carried_names(bundle)
    problems = []
    for soname in sorted(libraries.xcb_chain(bundle) & set(libraries.PACKAGES)):
        if soname not in carried and libraries.debian_package(soname) not in declared:
            problems.append(f"{soname} (Debian: {libraries.debian_package(soname)}) is neither in the package nor "
                            "in Depends")
    problems += [f"the bundle does not carry {s}, which Qt's xcb window needs (install "
                 f"{libraries.debian_package(s)} on the build machine and build again)"
                 for s in libraries.uncarried_xcb_libraries(bundle)]
    return problems


def system_paths() -> dict[str, str]:
    """soname -> path of this machine's libraries of the native architecture (``ldconfig -p``)."""
    text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    paths: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if match and ("x86-64" in match[2] or "AArch64" in match[2]):
            paths.setdefault(match[1], match[3])
    return paths


def file_owners(path: str) -> set[str]:
    """The Debian packages that installed ``path``, under either name it has on a merged-/usr system."""
    other = path.removeprefix("/usr") if path.startswith("/usr/lib/") else "/usr" + path
    result = subprocess.run(["dpkg", "-S", path, other], capture_output=True, text=True, check=False)
    owners = set()
    for line in result.stdout.splitlines():  # "libxcb1:amd64: /usr/lib/...", or "a:amd64, b:amd64: /path"
        if ": " in line:
            owners |= {name.strip().split(":")[0] for name in line.rsplit(": ", 1)[0].split(",")}
    return owners


def owner_problems(sonames: set[str], required: bool) -> tuple[list[str], list[str]]:
    """(problems, notes): each library's file here must belong to the Debian package the tables name for it."""
    problems, notes = [], []
    paths = system_paths()
    for soname in sorted(sonames):
        want = libraries.debian_package(soname)
        if soname not in paths:
            (problems if required else notes).append(f"{soname} ({want}) is not installed on this machine")
            continue
        owners = file_owners(paths[soname])
        if want not in owners:
            problems.append(f"{paths[soname]} belongs to {', '.join(sorted(owners)) or 'no package'}, not {want}")
    return problems, notes


def listing_problems(deb: Path) -> list[str]:
    """The file list: the bundle, the launcher link, the menu entry and icons; root-owned; no install.sh."""
    text = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    entries = {}
    for line in text.splitlines():
        mode, owner, _size, _date, _time, rest = line.split(None, 5)
        name, _, target = rest.partition(" -> ")
        entries[name] = (mode, owner, target)
    problems = [f"the package lacks {path}" for path in REQUIRED_PATHS if path not in entries]
    link = entries.get(LAUNCHER[0])
    if link is None or not link[0].startswith("l") or link[2] != LAUNCHER[1]:
        problems.append(f"{LAUNCHER[0]} is not a link to {LAUNCHER[1]}: {link}")
    problems += [f"{name} is owned by {owner}" for name, (_, owner, _) in entries.items() if owner != "root/root"]
    problems += [f"{name} is the archive's, not the package's" for name in entries
                 if name.rstrip("/") in ("./opt/hearth/install.sh", "./opt/hearth/share")]
    return problems


def install_problems(deb: Path, root: Path, dpkg_database: Path = Path("/var/lib/dpkg")) -> list[str]:
    """Install the package into ``root`` with dpkg, against a copy of ``dpkg_database`` (what is installed here)."""
    (root / "var" / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copytree(dpkg_database, root / "var" / "lib" / "dpkg", symlinks=True, dirs_exist_ok=True)
    # No triggers: they would run other packages' scripts (icon caches, menus) in a root that has no programs;
    # unsafe I/O: no fsync per file, the root is thrown away.
    command = ["dpkg", f"--root={root}", "--no-triggers", "--force-unsafe-io", "--log=/dev/null", "--install", str(deb)]
    if os.geteuid() != 0:
        command.insert(1, "--force-not-root")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return [f"dpkg could not install it here: {(result.stderr or result.stdout).strip()}"]
    return []


def check(deb: Path, root: Path, version: str) -> tuple[list[str], list[str]]:
    """(problems, notes) for the .deb, installed into the throwaway ``root``."""
    problems = install_problems(deb, root)
    if problems:
        return problems, []
    bundle = root / build_deb.INSTALL_DIR
    needs = libraries.system_needs(bundle)
    depends, recommends = build_deb.relations(needs)
    found = fields(deb)
    problems += field_problems(found, version, depends, recommends) + listing_problems(deb)
    problems += xcb_problems(bundle, found.get("Depends", ""))
    required_problems, _ = owner_problems(set(needs.required) - libraries.GLIBC_SONAMES, required=True)
    optional_problems, notes = owner_problems(set(needs.optional), required=False)
    return problems + required_problems + optional_problems, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deb", type=Path)
    parser.add_argument("--root", type=Path, help="the throwaway root to install into, kept (default: a temporary "
                                                   "directory, removed after the checks)")
    args = parser.parse_args(argv)
    version = _load("check_bundle").source_version()
    with tempfile.TemporaryDirectory(prefix="hearth-deb-") as tmp:
        problems, notes = check(args.deb.resolve(), (args.root or Path(tmp)).resolve(), version)
    found = fields(args.deb)
    print(f"deb: {args.deb.name}, {args.deb.stat().st_size / 1e6:.0f} MB; Depends: {found.get('Depends')}; "
          f"Recommends: {found.get('Recommends')}")
    for note in notes:
        print(f"note: {note} (an optional plugin's library)")
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print("deb check: " + ("failed" if problems else "passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
