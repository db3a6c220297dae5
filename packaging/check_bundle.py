"""Check a built Linux bundle before it ships: ``python packaging/check_bundle.py dist/hearth``.

- ``hearth --version``, run with an empty environment, prints ``engine.__version__`` of this source tree;
- the built-in model's assembled GGUF (``_internal/builtin/``) and the compiled C kernels are inside, nothing to
  download or assemble at first start;
- nothing excluded crept in (llama_cpp, llm, mlx, WebEngine, QML, ...; see bundle_contents.py);
- every library the bundle ships resolves its Qt/Python dependencies inside the bundle (``ldd``); missing system
  libraries (GTK for the GTK theme plugin, Wayland) are listed as what a desktop provides;
- the bundle carries every library Qt's xcb window needs (the xcb helpers a minimal system lacks, which
  ``app/platform_check.py`` names) except libxcb, OpenGL/EGL and glibc, which it leaves to the system on purpose
  (system_libraries.py; the .deb declares those).
Prints the sizes; exits 1 with the reasons when a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_LIBRARY = re.compile(r"^lib(Qt6|pyside6|shiboken6|python3)")


def _load(name: str):
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"hearth_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _contents():
    return _load("bundle_contents")


def source_version() -> str:
    """``engine.__version__`` of this source tree, read without importing anything else."""
    text = (ROOT / "engine" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.MULTILINE)
    if not match:
        raise ValueError("engine/__init__.py has no __version__")
    return match[1]


def clean_env(home: Path) -> dict[str, str]:
    """An environment with no Python and no virtualenv: HOME, an empty PATH directory, a UTF-8 locale."""
    empty_bin = home / "empty-bin"
    empty_bin.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "PATH": str(empty_bin), "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen"}


def version_problems(bundle: Path, expected: str) -> list[str]:
    with tempfile.TemporaryDirectory() as home:
        result = subprocess.run([str(bundle / "hearth"), "--version"], env=clean_env(Path(home)), cwd=home,
                                capture_output=True, text=True, timeout=120, check=False)
    printed = result.stdout.strip()
    print(f"bundle --version: {printed!r} (source: {expected})")
    if result.returncode != 0:
        return [f"hearth --version exited {result.returncode}: {result.stderr.strip()[-500:]}"]
    return [] if printed == f"hearth {expected}" else [f"hearth --version printed {printed!r}, not 'hearth {expected}'"]


def content_problems(bundle: Path, files: list[str]) -> list[str]:
    problems = []
    if not any(re.fullmatch(r"_internal/builtin/[^/]+\.gguf", f) for f in files):
        problems.append("the built-in model (_internal/builtin/*.gguf) is missing: the app would need its part "
                        "packages, which the bundle does not carry")
    if not any(re.fullmatch(r"_internal/engine/backends/cpu/_kernels[^/]*\.so", f) for f in files):
        problems.append("the C kernels (engine/backends/cpu/_kernels*.so) are missing")
    problems += [f"should not be bundled: {f}" for f in _contents().forbidden_paths(files, with_mlx=False)]
    return problems


def xcb_problems(bundle: Path) -> list[str]:
    """Libraries Qt's xcb window needs that the bundle should carry and does not (missing on the build machine)."""
    libraries = _load("system_libraries")
    if not (bundle / libraries.XCB_PLUGIN).is_file():
        return [f"Qt's xcb platform plugin ({libraries.XCB_PLUGIN}) is missing: no window on X11"]
    problems = []
    for soname in libraries.uncarried_xcb_libraries(bundle):
        try:
            fix = f"install {libraries.debian_package(soname)} on the build machine and build again"
        except libraries.UnknownLibraryError as e:
            fix = str(e)
        problems.append(f"the bundle does not carry {soname}, which Qt's xcb window needs: {fix}")
    return problems


def library_problems(bundle: Path, files: list[str]) -> tuple[list[str], set[str]]:
    """(problems, system libraries not found) from ``ldd`` over the executable and every shared object."""
    problems, system_missing = [], set()
    elves = [bundle / "hearth"] + [bundle / f for f in files if re.search(r"\.so(\.[\d.]+)?$", f)]
    for path in elves:
        result = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            name, _, where = line.strip().partition(" => ")
            if where.strip() != "not found":
                continue
            if BUNDLED_LIBRARY.match(name):
                problems.append(f"{path.relative_to(bundle)} needs {name}, which the bundle lacks")
            else:
                system_missing.add(name)
    return problems, system_missing


def _size_mb(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink()) / 1e6


def report_sizes(bundle: Path, files: list[str]) -> None:
    paths = [bundle / f for f in files]
    model = [p for p in paths if p.suffix == ".gguf"]
    qt = [p for p in paths if "/PySide6/" in str(p)]
    print(f"bundle size: {_size_mb(paths):.1f} MB (model {_size_mb(model):.1f} MB, Qt/PySide6 {_size_mb(qt):.1f} MB, "
          f"{len(files)} files)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the one-folder bundle (holds the hearth executable)")
    args = parser.parse_args(argv)
    bundle = args.bundle.resolve()
    files = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())
    problems = version_problems(bundle, source_version()) + content_problems(bundle, files)
    ldd_problems, system_missing = library_problems(bundle, files)
    problems += ldd_problems + xcb_problems(bundle)
    report_sizes(bundle, files)
    if system_missing:
        print("system libraries some optional plugins want, not on this machine: " + ", ".join(sorted(system_missing)))
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print("bundle check: " + ("failed" if problems else "passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
