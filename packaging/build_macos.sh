#!/usr/bin/env bash
# Build Hearth for Apple Silicon: dist/Hearth.app (MLX and its Metal library inside) and
# dist/Hearth-<version>-macos-arm64.dmg. Run on an arm64 Mac with Xcode's command line tools.
#
#   packaging/build_macos.sh [--no-install] [--no-dmg]
#   Environment: PYTHON (default python3); HEARTH_CODESIGN_IDENTITY="Developer ID Application: NAME (TEAMID)"
#   signs every binary and the app with the hardened runtime (unset: ad-hoc signature, for local use only).
#   Notarization is a separate step: see packaging/RELEASING.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
DIST=${HEARTH_DIST_DIR:-$ROOT/dist}
WORK=${HEARTH_WORK_DIR:-$ROOT/build/pyinstaller}
install=1
dmg=1
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --no-dmg) dmg=0 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "build_macos.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
if [ "$(uname -s)" != Darwin ] || [ "$(uname -m)" != arm64 ]; then
  echo "build_macos.sh: needs an Apple Silicon Mac (this is $(uname -s) $(uname -m))" >&2
  exit 1
fi
if [ "$("$PYTHON" -c 'import platform; print(platform.machine())')" != arm64 ]; then
  echo "build_macos.sh: $PYTHON is not an arm64 Python (Rosetta?); MLX needs a native one" >&2
  exit 1
fi

cd "$ROOT"
if [ "$install" = 1 ]; then
  "$PYTHON" -m pip install -q -e ".[packaging]"
fi
env -u HEARTH_CPU_ISA "$PYTHON" -c "
import mlx.core as mx
from engine.backends.cpu import kernels
if not mx.metal.is_available():
    raise SystemExit('MLX reports no Metal device')
if not kernels.AVAILABLE:
    raise SystemExit('the C kernels are not built (pip install -e . with Xcode command line tools)')
"
version=$("$PYTHON" -c "import engine; print(engine.__version__)")

"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath "$DIST" --workpath "$WORK" packaging/hearth.spec
app="$DIST/Hearth.app"
exe="$app/Contents/MacOS/hearth"

# The built app answers for itself before anything is packed: version, MLX's Metal library, a real chat.
printed=$("$exe" --version)
[ "$printed" = "hearth $version" ] || { echo "the app says '$printed', the source says $version" >&2; exit 1; }
find "$app" -name "*.metallib" | grep -q . || { echo "no Metal library (mlx.metallib) in $app" >&2; exit 1; }
smoke=$(mktemp -d)
QT_QPA_PLATFORM=offscreen "$exe" --smoke-test "$smoke/out"  # MLX on Metal, no window needed
echo "smoke test passed: $(ls "$smoke/out" | tr '\n' ' ')"
codesign --verify --deep --strict --verbose=2 "$app"
echo "app: $app ($(du -sh "$app" | cut -f1))"

if [ "$dmg" = 1 ]; then
  image="$DIST/Hearth-$version-macos-arm64.dmg"
  staging=$(mktemp -d)
  ditto "$app" "$staging/Hearth.app"  # ditto keeps the signatures, symlinks and extended attributes
  ln -s /Applications "$staging/Applications"
  rm -f "$image"
  hdiutil create -volname "Hearth $version" -srcfolder "$staging" -fs HFS+ -format UDZO -ov "$image"
  rm -rf "$staging"
  if [ -n "${HEARTH_CODESIGN_IDENTITY:-}" ]; then
    codesign --sign "$HEARTH_CODESIGN_IDENTITY" --timestamp "$image"
  fi
  echo "disk image: $image ($(du -sh "$image" | cut -f1))"
fi
