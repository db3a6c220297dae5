#!/usr/bin/env bash
# CI for the Linux bundle and its .deb: build them, check them, run the bundle's smoke test from outside the source
# tree with no Python on PATH (env -i), then the .deb's, unpacked, in a real X11 window under Xvfb; time the
# start-up, print the sizes. Meant to be called from .ci/run after the test suite.
#   packaging/ci_build_and_smoke.sh              build with packaging/build_linux.sh (pip install -e '.[packaging]')
#   packaging/ci_build_and_smoke.sh --no-install build in the environment as it is (kernels already compiled)
#   packaging/ci_build_and_smoke.sh --no-build   check an existing dist/hearth and dist/hearth_*.deb
# The bundle check includes the version test: `dist/hearth/hearth --version` must print engine.__version__
# (done here rather than in pytest: a build takes minutes on two cores).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python}
dist="${HEARTH_DIST_DIR:-$ROOT/dist}"
bundle="$dist/hearth"
began=$(date +%s)

case "${1:-}" in
  --no-build) ;;
  --no-install) bash "$ROOT/packaging/build_linux.sh" --no-archive --no-install --deb ;;
  "") bash "$ROOT/packaging/build_linux.sh" --no-archive --deb ;;
  *) echo "ci_build_and_smoke.sh: unknown option $1" >&2; exit 2 ;;
esac
built=$(date +%s)

"$PYTHON" "$ROOT/packaging/check_bundle.py" "$bundle"

# The smoke test as a person's machine would run it: another directory, an empty environment, no Python.
outside=$(mktemp -d /tmp/hearth-ci-XXXXXX)
mkdir -p "$outside/home" "$outside/empty-bin"
cd "$outside"
if env -i PATH="$outside/empty-bin" /bin/sh -c 'command -v python3 || command -v python' >/dev/null 2>&1; then
  echo "ci_build_and_smoke: Python is reachable from the smoke test's PATH" >&2
  exit 1
fi
env -i HOME="$outside/home" PATH="$outside/empty-bin" LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
  "$bundle/hearth" --smoke-test "$outside/smoke"
test -s "$outside/smoke/transcript.json"
echo "bundle smoke test passed (from $outside, no Python on PATH): $(ls "$outside/smoke" | tr '\n' ' ')"
"$PYTHON" - "$outside/smoke/transcript.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
backend = t["model"].get("backend")
print(f"bundle answered with {t['model'].get('name')} on the {backend} backend: {t['stats'].get('generated_tokens')} "
      f"tokens at {t['stats'].get('decode_tps')} tok/s")
if backend != "cpu":
    sys.exit(f"the bundle ran on {backend!r}, not the C kernels")
EOF
smoked=$(date +%s)

# The .deb: installed by dpkg into a throwaway root (Depends checked against this machine), its fields, files and
# declared libraries (check_deb.py); then the installed program as a desktop starts it: no Python, Qt's xcb
# platform in a real X11 window under Xvfb.
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/engine/__init__.py")
deb="$dist/hearth_${version}_$(dpkg --print-architecture).deb"
mkdir -p "$outside/deb-home"
"$PYTHON" "$ROOT/packaging/check_deb.py" "$deb" --root "$outside/deb-root"
# /usr/bin/hearth is a link to /opt/hearth/hearth: the bundle must find its _internal/ through a link.
ln -s "$outside/deb-root/opt/hearth/hearth" "$outside/hearth-link"
env -i HOME="$outside/deb-home" PATH="$outside/empty-bin" "$outside/hearth-link" --version
xvfb-run -a -s "-screen 0 1280x800x24" /bin/sh -c 'exec env -i DISPLAY="$DISPLAY" XAUTHORITY="$XAUTHORITY" \
  HOME="$1/deb-home" PATH="$1/empty-bin" LANG=C.UTF-8 QT_QPA_PLATFORM=xcb "$1/deb-root/opt/hearth/hearth" \
  --smoke-test "$1/deb-smoke"' sh "$outside"
test -s "$outside/deb-smoke/transcript.json"
echo ".deb smoke test passed (installed in a throwaway root, no Python on PATH, xcb under Xvfb):" \
  "$(ls "$outside/deb-smoke" | wc -l) files"
debbed=$(date +%s)

QT_QPA_PLATFORM=offscreen "$PYTHON" "$ROOT/packaging/measure_startup.py" --runs 5 --clean-env -- "$bundle/hearth"
rm -rf "$outside"

echo "bundle size on disk: $(du -sh "$bundle" | cut -f1) ($bundle); .deb: $(du -sh "$deb" | cut -f1)"
echo "ci_build_and_smoke: build (bundle and .deb) $((built - began)) s, bundle checks and smoke test" \
  "$((smoked - built)) s, .deb checks and smoke test $((debbed - smoked)) s, total $(($(date +%s) - began)) s"
