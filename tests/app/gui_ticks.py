"""How responsive the GUI thread is: a 10 ms QTimer's ticks, their longest gap and the fewest ticks in any 1 s window,
and, for a failing assertion, what the GUI thread (and every other thread) was doing while a tick was late, and which
garbage collections ran then (a collection holds the GIL: every thread waits for it)."""

from __future__ import annotations

import gc
import sys
import threading
import time

from PySide6.QtCore import QElapsedTimer, QTimer

TICK_MS = 10
LATE_MS = 40  # a tick this late has its GUI thread's stack sampled
STACK_DEPTH = 6


def frame_lines(frame, depth: int = STACK_DEPTH) -> str:
    """The innermost ``depth`` frames of a stack as 'file:line function' lines, innermost first."""
    lines = []
    while frame is not None and len(lines) < depth:
        code = frame.f_code
        lines.append(f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " <- ".join(lines)


class StallSampler:
    """A watchdog thread that samples every thread's stack whenever the GUI thread's timer is late.

    A sample is taken when the watchdog itself gets the GIL: if a worker thread holds the GIL the watchdog waits
    too, and the sample then shows what every thread was doing (the GUI thread waiting in Qt, a worker in Python).
    """

    def __init__(self, last_tick, gui_ident: int):
        self._last_tick, self._gui = last_tick, gui_ident
        self.samples: list[tuple[float, str, list[str]]] = []  # (monotonic ms, GUI stack, other threads' stacks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me, woke = threading.get_ident(), time.monotonic() * 1000
        while not self._stop.wait(0.005):
            now = time.monotonic() * 1000
            blocked, woke = now - woke - 5, now
            if now - self._last_tick() < LATE_MS and blocked < LATE_MS:
                continue
            frames = sys._current_frames()
            gui = frames.get(self._gui)
            others = [f"{_name(ident)}: {frame_lines(f, 4)}" for ident, f in frames.items()
                      if ident not in (self._gui, me)]
            if blocked >= LATE_MS:  # this thread waited too: the GIL was held (or the machine gave it no CPU)
                others.insert(0, f"(the sampler itself waited {blocked:.0f} ms; threads are where they resumed)")
            self.samples.append((now, frame_lines(gui) if gui else "(no Python frame)", others))


def _name(ident: int) -> str:
    thread = next((t for t in threading.enumerate() if t.ident == ident), None)
    return thread.name if thread else str(ident)


class Ticks:
    """A 10 ms QTimer on the GUI thread; after ``start()``, ``stop()`` gives the longest gap between its ticks.

    ``min_per_second()`` is the fewest ticks in any sliding 1 s window; ``culprits()`` lists what the GUI thread
    was doing while its ticks were late (for assertion messages).
    """

    def __init__(self):
        self.clock, self.times = QElapsedTimer(), []
        self.timer = QTimer(interval=TICK_MS)
        self.timer.timeout.connect(self._tick)
        self._last = 0.0
        self.sampler: StallSampler | None = None
        self.collections: list[tuple[float, float, int]] = []  # (monotonic ms start, end, generation)
        self._gc_start = 0.0

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.monotonic() * 1000
        if phase == "start":
            self._gc_start = now
        else:
            self.collections.append((self._gc_start, now, info["generation"]))

    def _tick(self) -> None:
        self.times.append(self.clock.elapsed())
        self._last = time.monotonic() * 1000
        self.wall.append(self._last)

    def start(self) -> None:
        self.times.clear()
        self.clock.start()
        self.times.append(0)
        self._last = time.monotonic() * 1000
        self.wall = [self._last]
        self.sampler = StallSampler(lambda: self._last, threading.get_ident())
        self.sampler.start()
        self.collections.clear()
        gc.callbacks.append(self._on_gc)
        self.timer.start()

    def stop(self) -> int:
        """The longest gap in ms (the last tick to now included)."""
        self.timer.stop()
        self.times.append(self.clock.elapsed())
        self.wall.append(time.monotonic() * 1000)
        self.sampler.stop()
        gc.callbacks.remove(self._on_gc)
        return self.longest_gap()

    def longest_gap(self) -> int:
        return max(b - a for a, b in zip(self.times, self.times[1:]))

    def min_per_second(self) -> int:
        """The fewest ticks in any sliding 1 s window (one starting at each tick); a run shorter than 1 s counts
        as its ticks scaled to a second."""
        times, end = self.times[1:-1], self.times[-1]
        if end < 1000:
            return round(len(times) * 1000 / max(end, 1))
        fewest, j = len(times), 0
        for i, t in enumerate([0, *times]):
            if t + 1000 > end:
                break
            while j < len(times) and times[j] < t + 1000:
                j += 1
            fewest = min(fewest, j - max(i - 1, 0) if i else j)
        return fewest

    def culprits(self, gaps: int = 3) -> str:
        """What every thread was doing during the longest ``gaps`` gaps (sampled every ~5 ms once 40 ms late)."""
        if self.sampler is None:
            return "not started"
        spans = sorted(zip(self.wall, self.wall[1:]), key=lambda ab: ab[0] - ab[1])[:gaps]
        out = []
        for a, b in spans:
            out.append(f"gap of {b - a:.0f} ms:")
            out.extend(f"  +{start - a:4.0f} garbage collection of generation {gen}: {end - start:.0f} ms"
                       for start, end, gen in self.collections if start <= b and end >= a and end - start >= 1)
            for t, gui, others in self.sampler.samples:
                if a <= t <= b + 5:
                    out.append(f"  +{t - a:4.0f} GUI {gui}")
                    out.extend(f"        {line}" for line in others if "stall-sampler" not in line
                               and "wait <- threading" not in line)
        return "\n".join(out)
