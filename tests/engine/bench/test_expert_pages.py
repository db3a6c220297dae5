"""``bench expert-pages``: the experts' decode products on the memory map and on anonymous copies in 2 MiB and
4 KiB pages give the same bits, read the chosen experts' bytes, and report how the pages are held."""

from __future__ import annotations

import sys

from engine.gguf_file import read_gguf
from tests.engine.bench_cli import bench, bench_json
from tests.engine.synthetic.specs import N_EXPERT, N_EXPERT_USED, SPECS
from tests.engine.synthetic.writer import write_synthetic

KINDS = ("gate", "up", "down")


def test_every_residency_gives_the_map_s_products_over_the_chosen_experts_bytes(tmp_path):
    path = write_synthetic(tmp_path / "gpt-oss.gguf", SPECS["gpt-oss"])
    r = bench_json("expert-pages", path, "--layers", "2", "--rounds", "3", "--threads", "2", "--json")
    with read_gguf(path) as g:
        per_expert = sum(g.tensor(f"blk.0.ffn_{kind}_exps.weight").nbytes for kind in KINDS) // N_EXPERT
        copied = sum(g.tensor(f"blk.{layer}.ffn_{kind}_exps.weight").nbytes for layer in (0, 1) for kind in KINDS)
    assert r["same_outputs"] is True and r["layers"] == 2 and r["rounds"] == 3
    assert r["bytes_per_round"] == 2 * N_EXPERT_USED * per_expert
    pages = ("2M", "4K") if sys.platform == "linux" else ("plain",)
    assert set(r["read_gb_per_s"]) == {"map", *(f"anonymous {p}" for p in pages)}
    assert all(0 < v["min"] <= v["median"] <= v["max"] for v in r["read_gb_per_s"].values())
    if sys.platform == "linux":
        assert r["anonymous_pages_kb"]["Rss"] * 1024 >= len(pages) * copied  # both copies resident
        assert r["map_pages_kb"]["Rss"] * 1024 >= 2 * N_EXPERT_USED * per_expert * 3 // 4  # the chosen rows read


def test_a_model_without_experts_is_refused(tmp_path):
    done = bench("expert-pages", write_synthetic(tmp_path / "llama.gguf", SPECS["llama"]), "--json")
    assert done.returncode == 2 and "has no experts" in done.stderr
