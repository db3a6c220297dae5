"""The bytes a decode step reads, against which the bench sets decode speed: a mixture of experts reads only its
chosen experts' rows."""

from __future__ import annotations

from engine.bench.bandwidth import weight_bytes_per_token
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
