"""Time Hearth from launch to its first painted window: ``python packaging/measure_startup.py [--runs N] -- CMD...``.

Each run starts CMD with ``HEARTH_STARTUP_PROBE=quit`` and its own ``--data-dir`` (kept across runs, as a
person's is), reads the probe line the app prints when the main window first paints, and subtracts the wall
clock read just before launching: the time includes the bundle's bootloader, Python's start, imports, the
store and the window. The model goes on loading in the background after that; the window is usable meanwhile.
One untimed run first warms the disk cache. Prints each time and the median; nothing is asserted.
``--clean-env`` runs with an empty environment (no Python on PATH); ``--xvfb`` starts an X server (Xvfb) and
uses Qt's xcb platform instead of the environment's QT_QPA_PLATFORM.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = re.compile(r"hearth-startup-probe window-painted epoch=([\d.]+) since_process_start=(\S+)")


def run_once(command: list[str], env: dict[str, str], data_dir: Path, timeout: float) -> tuple[float, str]:
    """Seconds from launch to the probe line, and the app's own since-process-start figure."""
    env = {**env, "HEARTH_STARTUP_PROBE": "quit"}
    launched = time.time()
    result = subprocess.run(command + ["--data-dir", str(data_dir)], env=env,
                            capture_output=True, text=True, timeout=timeout, check=False)
    match = PROBE.search(result.stdout)
    if result.returncode != 0 or not match:
        raise RuntimeError(f"no probe line (exit {result.returncode}): {result.stdout[-400:]} {result.stderr[-800:]}")
    return float(match[1]) - launched, match[2]


def base_env(clean: bool, home: Path) -> dict[str, str]:
    if not clean:
        return dict(os.environ)
    empty_bin = home / "empty-bin"
    empty_bin.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "PATH": str(empty_bin), "LANG": "C.UTF-8"}
    if "QT_QPA_PLATFORM" in os.environ:
        env["QT_QPA_PLATFORM"] = os.environ["QT_QPA_PLATFORM"]
    return env


def start_xvfb(display: str) -> subprocess.Popen:
    xvfb = shutil.which("Xvfb")
    if not xvfb:
        raise SystemExit("--xvfb needs Xvfb (Debian: apt-get install xvfb)")
    server = subprocess.Popen([xvfb, display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    if server.poll() is not None:
        raise SystemExit(f"Xvfb {display} did not start")
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clean-env", action="store_true", help="empty environment, no Python on PATH")
    parser.add_argument("--xvfb", metavar="DISPLAY", nargs="?", const=":97", help="run under Xvfb on DISPLAY")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("command", nargs="+", help="e.g. dist/hearth/hearth, or python -m app")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hearth-startup-") as tmp:
        env = base_env(args.clean_env, Path(tmp))
        server = None
        if args.xvfb:
            server = start_xvfb(args.xvfb)
            env.update(DISPLAY=args.xvfb, QT_QPA_PLATFORM="xcb")
        try:
            data_dir = Path(tmp) / "data"
            run_once(args.command, env, data_dir, args.timeout)  # warm-up: disk cache, first-run database
            results = [run_once(args.command, env, data_dir, args.timeout) for _ in range(args.runs)]
        finally:
            if server:
                server.terminate()
                server.wait()
    times = [t for t, _ in results]
    platform = env.get("QT_QPA_PLATFORM", "default")
    print(f"launch to first painted window ({platform}), {args.runs} runs: "
          + ", ".join(f"{t:.2f}" for t in times) + " s")
    print("  app's own figure (process start to paint): " + ", ".join(s for _, s in results) + " s")
    print(f"startup median: {statistics.median(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
