"""The process's and the machine's memory read without psutil, so tests can check the app's psutil figures against
a second source: /proc on Linux; ``ps`` and ``vm_stat`` elsewhere (macOS)."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def process_rss_bytes() -> int:
    """The resident set size of this process."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(os.getpid())], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) * 1024


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields[field].split()[0]) * 1024


def total_bytes() -> int:
    """Physical memory of the machine."""
    if sys.platform.startswith("linux"):
        return _meminfo("MemTotal")
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_bytes() -> int:
    """Memory available to new programs without swapping (Linux's MemAvailable; on macOS free + inactive pages)."""
    if sys.platform.startswith("linux"):
        return _meminfo("MemAvailable")
    out = subprocess.run(["vm_stat"], capture_output=True, text=True, check=True).stdout
    page = int(re.search(r"page size of (\d+)", out).group(1))
    pages = {k.strip(): int(v.strip().rstrip(".")) for k, v in re.findall(r"^(Pages [^:]+):\s+(\d+\.?)$", out, re.M)}
    return (pages["Pages free"] + pages["Pages inactive"]) * page


def process_cpu_seconds() -> float:
    """User plus system CPU time this process has used."""
    times = os.times()
    return times.user + times.system
