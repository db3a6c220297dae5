#!/usr/bin/env bash
# Build Hearth for Linux: the one-folder bundle dist/hearth/ (start it with dist/hearth/hearth), unless
# --no-archive dist/hearth-<version>-linux-<arch>.tar.gz around it, and with --deb the Debian/Ubuntu package
# dist/hearth_<version>_<debian-arch>.deb (packaging/build_deb.py). The folder also carries install.sh, which puts
# Hearth in the desktop's application menu (a .desktop file and icons under ~/.local/share).
# No AppImage: appimagetool and the AppImage runtime are neither on PyPI nor in Debian (see RELEASING.md).
#
#   packaging/build_linux.sh [--no-install] [--no-archive] [--deb]
#     --no-install  use the current environment as it is (default: pip install -e '.[packaging]' first,
#                   which also compiles the C kernels)
#     --no-archive  leave out the .tar.gz (CI only needs the folder)
#     --deb         also build the .deb (needs dpkg-deb, which every Debian and Ubuntu has)
#   Environment: PYTHON (default python), HEARTH_DIST_DIR (default dist/), HEARTH_WORK_DIR (default
#   build/pyinstaller/).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python}
DIST=${HEARTH_DIST_DIR:-$ROOT/dist}
WORK=${HEARTH_WORK_DIR:-$ROOT/build/pyinstaller}
install=1
archive=1
deb=0
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --no-archive) archive=0 ;;
    --deb) deb=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build_linux.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

cd "$ROOT"
if [ "$install" = 1 ]; then
  "$PYTHON" -m pip install -q -e ".[packaging]"
fi
# The bundle must carry the compiled kernels, never the NumPy fallback.
env -u HEARTH_CPU_ISA "$PYTHON" -c "
from engine.backends.cpu import kernels
if not kernels.AVAILABLE:
    raise SystemExit('the C kernels (engine.backends.cpu._kernels) are not built; run pip install -e . with a C compiler')
"
version=$("$PYTHON" -c "import engine; print(engine.__version__)")

"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath "$DIST" --workpath "$WORK" packaging/hearth.spec

bundle="$DIST/hearth"
# What install.sh needs sits beside the executable (outside _internal/, which PyInstaller owns).
mkdir -p "$bundle/share/icons"
cp packaging/linux/hearth.desktop "$bundle/share/"
cp resources/hearth.svg resources/hearth-*.png "$bundle/share/icons/"
install -m 755 packaging/linux/install.sh "$bundle/install.sh"

echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1))"
if [ "$archive" = 1 ]; then
  tarball="$DIST/hearth-$version-linux-$(uname -m).tar.gz"
  tar -C "$DIST" -czf "$tarball" --transform "s,^hearth,hearth-$version,S" hearth  # S: leave link targets
  echo "archive: $tarball ($(du -sh "$tarball" | cut -f1))"
fi
if [ "$deb" = 1 ]; then
  "$PYTHON" packaging/build_deb.py "$bundle" --out "$DIST"
fi
