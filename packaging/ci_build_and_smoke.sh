#!/usr/bin/env bash
# CI for the Linux bundle: build it, check it, run its smoke test from outside the source tree with no Python on
# PATH (env -i), time its start-up, print its size. Meant to be called from .ci/run after the test suite.
#   packaging/ci_build_and_smoke.sh              build with packaging/build_linux.sh (pip install -e '.[packaging]')
#   packaging/ci_build_and_smoke.sh --no-install build in the environment as it is (kernels already compiled)
#   packaging/ci_build_and_smoke.sh --no-build   check an existing dist/hearth
# The bundle check includes the version test: `dist/hearth/hearth --version` must print engine.__version__
# (done here rather than in pytest: a build takes minutes on two cores).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python}
bundle="${HEARTH_DIST_DIR:-$ROOT/dist}/hearth"
began=$(date +%s)

case "${1:-}" in
  --no-build) ;;
  --no-install) bash "$ROOT/packaging/build_linux.sh" --no-archive --no-install ;;
  "") bash "$ROOT/packaging/build_linux.sh" --no-archive ;;
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

QT_QPA_PLATFORM=offscreen "$PYTHON" "$ROOT/packaging/measure_startup.py" --runs 5 --clean-env -- "$bundle/hearth"
rm -rf "$outside"

echo "bundle size on disk: $(du -sh "$bundle" | cut -f1) ($bundle)"
echo "ci_build_and_smoke: build $((built - began)) s, checks and smoke test $((smoked - built)) s, total $(($(date +%s) - began)) s"
