"""The bytes a decode step reads, against which the bench sets decode speed (a mixture of experts reads only its
chosen experts' rows), and the read pass's rate over the window when every thread reads."""

from __future__ import annotations

import pytest

import numpy as np

from engine.backends.cpu import kernels
from engine.bench.bandwidth import concurrent_read_rate, measure_read_bandwidth, weight_bytes_per_token
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.memory_estimate import EXPERT_TENSOR_SUFFIXES
from tests.engine.synthetic.specs import N_EXPERT, N_EXPERT_USED, SPECS
from tests.engine.synthetic.writer import write_synthetic


def test_a_moe_decode_step_reads_the_chosen_experts_and_one_embedding_row(tmp_path):
    with read_gguf(write_synthetic(tmp_path / "moe.gguf", SPECS["qwen3moe"])) as g:
        config = ModelConfig.from_gguf(g)
        sizes = {name: g.raw(name).nbytes for name in g.tensors}
        experts = sum(n for name, n in sizes.items() if name.endswith(EXPERT_TENSOR_SUFFIXES))
        embedding = sizes["token_embd.weight"]
        assert "output.weight" in sizes and experts > 0
        dense = sum(sizes.values()) - experts - embedding + embedding // config.n_vocab
        assert weight_bytes_per_token(g, config) == dense + experts * N_EXPERT_USED // N_EXPERT
        assert weight_bytes_per_token(g) == dense + experts  # without the config: every expert


GB = 10**9


def test_a_thread_that_starts_late_does_not_count_against_the_pass():
    # thread 0 reads a GB a second from t = 0; thread 1 starts half a second late (its GIL turn) and reads as fast:
    # together they read 2 GB/s, though 7 GB over the 4.5 s from first start to last end would say 1.56
    early = [(0.0, 1.0, GB), (1.0, 2.0, GB), (2.0, 3.0, GB), (3.0, 4.0, GB)]
    late = [(1.5, 2.5, GB), (2.5, 3.5, GB), (3.5, 4.5, GB)]
    assert concurrent_read_rate([early, late], fallback_seconds=4.5) == pytest.approx(2.0)
    assert concurrent_read_rate([early], fallback_seconds=4.0) == pytest.approx(1.0)


def test_threads_that_never_overlap_give_the_low_wall_clock_figure():
    first, second = [(0.0, 1.0, GB), (1.0, 2.0, GB)], [(2.5, 3.5, GB), (3.5, 4.5, GB)]
    assert concurrent_read_rate([first, second], fallback_seconds=4.5) == pytest.approx(4 / 4.5)


@pytest.mark.parametrize("words", [0, 1, 7, 8, 9, 4096 + 13])
@pytest.mark.parametrize("ahead", [0, 4096])
def test_the_kernels_read_loop_sums_every_word(words, ahead):
    values = np.random.default_rng(words).integers(-(2**62), 2**62, words, dtype=np.int64)
    default = kernels.stream_prefetch()
    try:
        kernels.stream_prefetch(ahead)
        assert kernels.read_words(values) == int(values.astype(np.uint64).sum(dtype=np.uint64))
    finally:
        kernels.stream_prefetch(default)
    with pytest.raises(ValueError, match="64-bit words"):
        kernels.read_words(np.zeros(5, np.uint8))


def test_the_pass_takes_both_readers_in_turn_and_reports_the_best():
    report = measure_read_bandwidth(threads=2, passes=3, buffer_bytes=8 * 2**20)
    assert report["rates_by_reader"]["numpy"] == report["rates"][0::2] and len(report["rates"]) == 3
    assert report["rates_by_reader"]["kernels"] == report["rates"][1::2]
    assert report["gbps"] == max(report["rates"]) and "read loop" in report["method"]
