"""The real-size bench model writer, on its tiny shapes: the files load in llama.cpp and in ours, with the tensor
shapes, types and metadata asked for."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ggml_types import GGMLQuantizationType as Q
from engine.gguf_file import read_gguf
from tests.engine.bench_cli import bench, bench_json
from tests.llama_cpp_sources import vocab_file


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-models")
    results = bench_json("make-models", "--out", out, "--models", "tiny-qwen3", "--types", "Q4_K_M", "IQ4_XS", "MXFP4",
                         "--vocab-from", vocab_file("qwen2"), "--check")
    return {r["type"]: r for r in results}


def test_each_file_loads_in_llama_cpp_and_ours_and_both_agree(written):
    assert set(written) == {"Q4_K_M", "IQ4_XS", "MXFP4"}
    for result in written.values():
        assert result["loads"] == {"llama.cpp": True, "hearth": True, "same_argmax": True}, result


def test_the_q4_k_m_mix_gives_attn_v_and_ffn_down_and_the_tied_embedding_more_bits(written):
    with read_gguf(written["Q4_K_M"]["file"]) as g:
        assert g.tensor("token_embd.weight").qtype == Q.Q6_K  # tied: it is the output matrix too
        assert "output.weight" not in g.tensors
        # llama.cpp's use_more_bits over 2 layers picks layer 1 (the last eighth), not layer 0
        assert g.tensor("blk.1.attn_v.weight").qtype == Q.Q6_K and g.tensor("blk.1.ffn_down.weight").qtype == Q.Q6_K
        assert g.tensor("blk.0.attn_v.weight").qtype == Q.Q4_K and g.tensor("blk.0.ffn_down.weight").qtype == Q.Q4_K
        assert g.tensor("blk.1.attn_q.weight").qtype == Q.Q4_K and g.tensor("blk.1.ffn_up.weight").qtype == Q.Q4_K
        assert g.tensor("blk.0.attn_q_norm.weight").qtype == Q.F32


def test_shapes_and_metadata_are_the_models(written):
    with read_gguf(written["IQ4_XS"]["file"]) as g:
        vocab = read_gguf(vocab_file("qwen2"))
        n_vocab = len(vocab.metadata["tokenizer.ggml.tokens"])
        assert g.get("general.architecture", str) == "qwen3" and g.get("qwen3.block_count", int) == 2
        assert g.get("qwen3.attention.key_length", int) == 64 and g.get("qwen3.attention.head_count_kv", int) == 2
        assert g.tensor("token_embd.weight").shape == (256, n_vocab)  # GGUF order: columns first
        assert g.tensor("blk.1.ffn_down.weight").shape == (512, 256)
        assert g.tensor("blk.1.attn_k.weight").shape == (256, 128)
        assert {g.tensor(n).qtype for n in g.tensors if n.endswith(("attn_q.weight", "ffn_gate.weight"))} == {Q.IQ4_XS}
        assert list(g.metadata["tokenizer.ggml.tokens"]) == list(vocab.metadata["tokenizer.ggml.tokens"])
        assert g.get("tokenizer.ggml.pre", str) == "qwen2"
        vocab.close()


def test_the_weights_have_the_intended_spread(written):
    from gguf.quants import dequantize

    with read_gguf(written["MXFP4"]["file"]) as g:
        w = dequantize(np.asarray(g.raw("blk.0.ffn_up.weight")[:64]), Q.MXFP4)
        assert np.isfinite(w).all() and 0.01 < float(w.std()) < 0.04


def test_a_vocabulary_of_the_wrong_family_is_refused(tmp_path):
    done = bench("make-models", "--out", tmp_path, "--models", "tiny-llama", "--types", "Q8_0",
                 "--vocab-from", vocab_file("qwen2"))
    assert done.returncode == 2 and "needs a --vocab-from file with a 'llama-bpe' vocabulary" in done.stderr
    assert not list(tmp_path.glob("*.gguf"))
