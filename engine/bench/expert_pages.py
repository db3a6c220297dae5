"""The experts' products on the model's memory map against anonymous copies of the same bytes, paired in one process.

``python -m engine bench expert-pages MODEL.gguf [--layers N] [--rounds N] [--threads N] [--json]`` copies the
expert tensors of the first ``--layers`` layers into private anonymous memory twice, advised 2 MiB pages
(``MADV_HUGEPAGE``) and 4 KiB pages (``MADV_NOHUGEPAGE``), then times decode-shaped work on each residency in
turn, in a shuffled order every round: per layer ``n_expert_used`` random experts, each one's gate, up and down
matrix-vector product (the C kernels, the thread pool). It prints the read bandwidth of each residency (median,
min, max over the rounds) and how the pages are held: ``FilePmdMapped`` of the map (the page cache's 2 MiB folios
mapped whole) and ``AnonHugePages`` of the copies, from ``/proc/self/smaps``. Every residency's products are
checked equal to the map's, bit for bit. Linux; elsewhere the page fields are absent and only the map and a
plain copy run.

It answers whether the weights' page size costs decode speed on this machine (TLB misses of 4 KiB pages, page
cache folios left small by an earlier reader) apart from everything else the decoder does.
"""

from __future__ import annotations

import mmap
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ..backends.cpu import kernels
from ..config import ModelConfig
from ..gguf_file import read_gguf

HUGE = 2 << 20
KINDS = ("gate", "up", "down")
SMAPS_FIELDS = ("Rss", "FilePmdMapped", "AnonHugePages")


def smaps_kb(match) -> dict[str, int]:
    """Sums of ``SMAPS_FIELDS`` (kB) over this process's mappings for which ``match(start, end, name)`` holds;
    {} where /proc/self/smaps does not exist."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return {}
    totals, inside = dict.fromkeys(SMAPS_FIELDS, 0), False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            inside = match(start, end, head[5] if len(head) > 5 else "")
        elif inside and head and head[0][:-1] in totals and len(head) > 1:
            totals[head[0][:-1]] += int(head[1])
    return totals


def anonymous_copy(blocks: np.ndarray, page: str) -> tuple[mmap.mmap, np.ndarray]:
    """``blocks`` copied into a private anonymous map, 2 MiB aligned, advised ``page`` ("2M", "4K" or "plain")
    before the copy faults its pages in; returns the map (keep it alive) and the copy's view."""
    buf = mmap.mmap(-1, blocks.nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = {"2M": getattr(mmap, "MADV_HUGEPAGE", None), "4K": getattr(mmap, "MADV_NOHUGEPAGE", None)}.get(page)
    if advice is not None:
        buf.madvise(advice)
    whole = np.frombuffer(buf, np.uint8)
    start = -whole.ctypes.data % HUGE
    copy = whole[start:start + blocks.nbytes].reshape(blocks.shape)
    copy[...] = blocks
    return buf, copy


def residencies() -> tuple[str, ...]:
    """The anonymous page sizes this platform can ask for."""
    return ("2M", "4K") if hasattr(mmap, "MADV_HUGEPAGE") and sys.platform == "linux" else ("plain",)


def run(path: Path, n_layers: int, rounds: int, threads: int, seed: int = 0) -> dict:
    """The paired comparison (see the module docstring) as a report dict."""
    if rounds < 1 or n_layers < 1:
        raise ValueError("--rounds and --layers must be at least 1")
    kernels.set_threads(threads)
    with read_gguf(path) as g:
        config = ModelConfig.from_gguf(g)
        if not config.is_moe:
            raise ValueError(f"{path} has no experts")
        layers = range(min(n_layers, config.n_layers))
        mats = {(layer, kind): g.raw(f"blk.{layer}.ffn_{kind}_exps.weight") for layer in layers for kind in KINDS}
        qtypes = {kind: int(g.tensor(f"blk.0.ffn_{kind}_exps.weight").qtype) for kind in KINDS}
        maps = {"map": mats}
        keep, copy_seconds = [], {}
        for page in residencies():
            start, copies = time.perf_counter(), {}
            for key, blocks in mats.items():
                buf, copies[key] = anonymous_copy(blocks, page)
                keep.append(buf)
            maps[f"anonymous {page}"], copy_seconds[f"anonymous {page}"] = copies, time.perf_counter() - start
        resolved = str(Path(path).resolve())
        file_pages = smaps_kb(lambda lo, hi, name: name == resolved)
        addresses = [np.frombuffer(buf, np.uint8).ctypes.data for buf in keep]  # adjacent copies may share a mapping
        anon_pages = smaps_kb(lambda lo, hi, name: any(lo <= a < hi for a in addresses))
        rates, same, step_bytes = {name: [] for name in maps}, True, 0
        rng = random.Random(seed)
        x = np.random.default_rng(seed).standard_normal((1, config.n_embd)).astype(np.float32)
        h = np.random.default_rng(seed + 1).standard_normal((1, config.n_ff_exp)).astype(np.float32)
        for _ in range(rounds):
            picks = {layer: rng.sample(range(config.n_expert), config.n_expert_used) for layer in layers}
            order = list(maps)
            rng.shuffle(order)
            outputs = {}
            for name in order:
                seconds, step_bytes, outputs[name] = _decode_like(maps[name], qtypes, picks, config, x, h)
                rates[name].append(step_bytes / seconds / 1e9)
            same = same and all(np.array_equal(outputs["map"], out) for out in outputs.values())
        del maps, mats
    return {"file": str(path), "threads": threads, "layers": len(layers), "rounds": rounds,
            "bytes_per_round": step_bytes, "same_outputs": same,
            "read_gb_per_s": {name: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                                     "max": round(max(v), 2)} for name, v in rates.items()},
            "copy_seconds": {k: round(v, 2) for k, v in copy_seconds.items()},
            "map_pages_kb": file_pages, "anonymous_pages_kb": anon_pages}


def _decode_like(mats: dict, qtypes: dict, picks: dict, config: ModelConfig, x: np.ndarray, h: np.ndarray):
    """Seconds and bytes of the picked experts' gate, up and down products, and their outputs concatenated."""
    outs, nbytes = [], 0
    start = time.perf_counter()
    for layer, experts in picks.items():
        for e in experts:
            for kind in KINDS:
                w = mats[(layer, kind)]
                rows = w.shape[0] // config.n_expert
                part = w[e * rows:(e + 1) * rows]
                outs.append(kernels.matmul(part, qtypes[kind], h if kind == "down" else x))
                nbytes += part.nbytes
    seconds = time.perf_counter() - start
    return seconds, nbytes, np.concatenate([o.reshape(-1) for o in outs])
