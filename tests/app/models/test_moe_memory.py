"""Memory truth for sparse models on synthetic mixture-of-experts files: every expert resident (memory-mapped),
the bytes one token reads, the estimate against the measured resident set after a 512-token chat, and the
"paged" verdict when the mapped weights are more than the free memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.model_fit import gb_text, local_estimate
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.memory_estimate import estimate_memory, fit_verdict
from tests.app.models.measure_moe_memory import measure_chat
from tests.engine.synthetic.specs import N_EXPERT_USED, SPECS
from tests.engine.synthetic.writer import write_synthetic

N_EXPERT = 32  # 100 MB of float32 experts: large next to the interpreter's own growth, and 2 of 32 read per token


def _sparse_file(folder: Path, name: str) -> Path:
    spec = SPECS[name]
    spec = dataclasses.replace(spec, n_expert=N_EXPERT, metadata={**spec.metadata, "expert_count": N_EXPERT})
    return write_synthetic(folder / f"{name}-{N_EXPERT}x.gguf", spec)


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sparse")
    return {name: _sparse_file(folder, name) for name in ("gpt-oss", "qwen3moe")}


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3moe"])
def test_estimate_within_15_percent_of_the_resident_set_after_a_512_token_chat(sparse_files, name):
    r = measure_chat(sparse_files[name], n_tokens=512)
    assert r["tokens"] >= 480  # the conversation filled the context it was estimated for
    assert abs(r["total"] - r["measured"]) <= 0.15 * r["measured"], r
    assert r["measured"] >= 0.9 * r["weights"]  # every expert was read by some token: all resident
    assert r["active"] < 0.15 * r["weights"]  # while one token reads its 2 of 32 experts and the shared tensors


def test_all_experts_are_resident_and_the_chosen_ones_read(sparse_files):
    with read_gguf(sparse_files["gpt-oss"]) as g:
        config = ModelConfig.from_gguf(g)
        e = estimate_memory(g, 512, "cpu")
        experts = sum(t.nbytes for name, t in g.tensors.items() if "_exps.weight" in name)
        assert e.weights_bytes == e.mapped_bytes == sum(t.nbytes for t in g.tensors.values())
        assert e.active_weights_bytes == round(e.weights_bytes - experts * (1 - N_EXPERT_USED / config.n_expert))
        assert estimate_memory(g, 512, "numpy").mapped_bytes == 0  # NumPy copies the weights out as float32


@pytest.mark.parametrize("total, mapped, verdict", [(750, 500, "fits"), (1000, 500, "tight"), (1500, 500, "paged"),
                                                    (1501, 500, "won't fit"), (1001, 0, "won't fit")])
def test_only_mapped_weights_past_the_free_memory_run_paged(total, mapped, verdict):
    assert fit_verdict(total, 1000, mapped) == verdict


def test_the_verdict_for_a_file_larger_than_free_memory_says_it_runs_from_the_page_cache(sparse_files):
    path = sparse_files["gpt-oss"]
    roomy = local_estimate(str(path), 512, available=10 ** 12)
    assert roomy.runs and roomy.verdict == "fits" and roomy.mapped == roomy.weights
    assert f"reads {gb_text(roomy.active_weights)} per token (all experts resident)" in roomy.summary()
    short = local_estimate(str(path), 512, available=roomy.weights // 2)  # the file is twice the free memory
    assert short.verdict == "paged"
    summary = short.summary()
    assert summary.startswith("Runs here, slowly · needs ")
    assert "OS page cache" in summary and "decoding slows down" in summary
    assert local_estimate(str(path), 512, available=(roomy.total - roomy.weights) // 2).verdict == "won't fit"
