"""Throughput drift: infer thermal throttling from decode steps that get slower while the load stays the same.

Decode-step times are grouped by *load* (a hashable key the caller chooses, e.g. batch size and a context-length
bucket), since a bigger batch or a longer context is slower for reasons that have nothing to do with heat. Within
one load, steps are taken in blocks; a block's median (robust to spikes) is compared with that load's baseline, a
low quantile of its earlier block medians (the machine's cool speed, robust to noise). A sustained rise sets
``throttled``; a sustained return clears it.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Hashable


@dataclasses.dataclass(frozen=True)
class DriftConfig:
    block_steps: int = 8  # decode steps per block; each block contributes its median
    warmup_steps: int = 2  # steps ignored after the load changes (cache growth, cold pages)
    rise_ratio: float = 1.3  # block median / baseline at or above this is a slow block
    clear_ratio: float = 1.12  # at or below this is a normal block again
    sustain_blocks: int = 3  # consecutive slow blocks to fire; consecutive normal blocks to clear
    min_baseline_blocks: int = 3  # blocks a load needs before it has a baseline
    baseline_quantile: float = 0.2
    history_blocks: int = 256  # block medians remembered per load
    stale_blocks: int = 12  # while throttled, blocks with no baseline to compare before giving up the flag


@dataclasses.dataclass(frozen=True)
class DriftStatus:
    """What the detector concluded after the latest block."""

    throttled: bool
    ratio: float | None  # latest block median / its load's baseline; None without a baseline
    reason: str  # why ``throttled`` has its value: the last change, or that none happened yet


class DriftDetector:
    """Feed it every decode step with ``observe``; read ``status``. Not thread-safe."""

    def __init__(self, config: DriftConfig = DriftConfig()):
        self.config = config
        self.status = DriftStatus(False, None, "no sustained slowdown seen")
        self._history: dict[Hashable, collections.deque[float]] = {}  # per load: block medians when not throttled
        self._load: Hashable = None
        self._block: list[float] = []  # step seconds of the block being filled
        self._skip = config.warmup_steps
        self._slow_run = self._normal_run = self._stale_run = 0

    @property
    def throttled(self) -> bool:
        return self.status.throttled

    def observe(self, seconds: float, load: Hashable) -> None:
        """Record one decode step that took ``seconds`` under ``load``."""
        if not seconds > 0:
            return  # a clock that did not move (a fake one, or too coarse) says nothing about speed
        if load != self._load:
            self._load, self._block, self._skip = load, [], self.config.warmup_steps
        if self._skip > 0:
            self._skip -= 1
            return
        self._block.append(seconds)
        if len(self._block) >= self.config.block_steps:
            median = statistics.median(self._block)
            self._block = []
            self._finish_block(load, median)

    def baseline(self, load: Hashable) -> float | None:
        """The cool-machine block median for ``load``, once it has enough history."""
        history = self._history.get(load)
        if history is None or len(history) < self.config.min_baseline_blocks:
            return None
        ordered = sorted(history)
        return ordered[int(self.config.baseline_quantile * (len(ordered) - 1))]

    def _finish_block(self, load: Hashable, median: float) -> None:
        history = self._history.setdefault(load, collections.deque(maxlen=self.config.history_blocks))
        baseline = self.baseline(load)
        if baseline is None:
            self._without_baseline(history, median)
        elif self.status.throttled:
            self._while_throttled(median / baseline)
        else:
            self._while_normal(history, median, median / baseline)

    def _without_baseline(self, history: collections.deque, median: float) -> None:
        if not self.status.throttled:
            history.append(median)  # learning this load's speed
            self._set_ratio(None)
            return
        self._stale_run += 1  # a hot machine must not become the baseline of a new load
        if self._stale_run >= self.config.stale_blocks:
            self._set(False, None, "released: no cool baseline for the current load to compare with")

    def _while_normal(self, history: collections.deque, median: float, ratio: float) -> None:
        self._slow_run = self._slow_run + 1 if ratio >= self.config.rise_ratio else 0
        if self._slow_run == 0:
            history.append(median)
        if self._slow_run >= self.config.sustain_blocks:
            self._set(True, ratio, f"decode steps {ratio:.2f}x slower than baseline for {self._slow_run} blocks")
        else:
            self._set_ratio(ratio)

    def _while_throttled(self, ratio: float) -> None:
        self._stale_run = 0
        self._normal_run = self._normal_run + 1 if ratio <= self.config.clear_ratio else 0
        if self._normal_run >= self.config.sustain_blocks:
            self._set(False, ratio, f"decode speed back to {ratio:.2f}x baseline")
        else:
            self._set_ratio(ratio)

    def _set_ratio(self, ratio: float | None) -> None:
        self.status = dataclasses.replace(self.status, ratio=ratio)

    def _set(self, throttled: bool, ratio: float | None, reason: str) -> None:
        self.status = DriftStatus(throttled, ratio, reason)
        self._slow_run = self._normal_run = self._stale_run = 0
