"""A tiny model whose matrices mix every IQ / MXFP4 type, as Unsloth-style files do, written by llama.cpp's own
quantizer: the C decoder (CPU backend) runs it and agrees with the NumPy reference, which dequantizes with gguf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.kv_cache import NumpyKVCache
from tests.engine.test_cpu_kernels_llama import Ggml

pytestmark = pytest.mark.slow  # llama.cpp's IQ2 / IQ3 quantizers search their grids: about a minute on 2 cores

T = GGMLQuantizationType
N_VOCAB, N_EMBD, N_FF, N_HEADS, N_KV, HEAD_DIM, N_LAYERS = 300, 256, 512, 4, 2, 64, 2
# one matrix kind per type; 256-element rows everywhere but ffn_down (512)
MATRIX_TYPES = {"token_embd": T.IQ2_XS, "attn_q": T.IQ4_NL, "attn_k": T.IQ3_S, "attn_v": T.IQ2_S, "attn_output": T.MXFP4,
                "ffn_gate": T.IQ2_XXS, "ffn_up": T.IQ3_XXS, "ffn_down": T.IQ4_XS}


def write_mixed_model(path: Path, ggml: Ggml) -> Path:
    arch = "llama"
    writer = GGUFWriter(path, arch)
    for key, value in {"block_count": N_LAYERS, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
                       "attention.head_count": N_HEADS, "attention.head_count_kv": N_KV, "rope.dimension_count": HEAD_DIM,
                       "context_length": 512}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    rng = np.random.default_rng(0)

    def add(name: str, shape: tuple[int, ...], scale: float = 0.1, offset: float = 0.0) -> None:
        values = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        qtype = MATRIX_TYPES.get(name.split(".")[-2])
        if qtype is None:
            writer.add_tensor(name, values)
            return
        imatrix = rng.uniform(0.5, 2.0, shape[1]).astype(np.float32) if ggml.requires_imatrix(qtype) else None
        writer.add_tensor(name, ggml.quantize(qtype, values, imatrix), raw_dtype=qtype)

    add("token_embd.weight", (N_VOCAB, N_EMBD), 0.5)
    for il in range(N_LAYERS):
        blk = f"blk.{il}."
        add(blk + "attn_norm.weight", (N_EMBD,), 0.1, 1.0)
        add(blk + "attn_q.weight", (N_HEADS * HEAD_DIM, N_EMBD))
        add(blk + "attn_k.weight", (N_KV * HEAD_DIM, N_EMBD))
        add(blk + "attn_v.weight", (N_KV * HEAD_DIM, N_EMBD))
        add(blk + "attn_output.weight", (N_EMBD, N_HEADS * HEAD_DIM))
        add(blk + "ffn_norm.weight", (N_EMBD,), 0.1, 1.0)
        add(blk + "ffn_gate.weight", (N_FF, N_EMBD))
        add(blk + "ffn_up.weight", (N_FF, N_EMBD))
        add(blk + "ffn_down.weight", (N_EMBD, N_FF))
    add("output_norm.weight", (N_EMBD,), 0.1, 1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory) -> Path:
    return write_mixed_model(tmp_path_factory.mktemp("iq") / "mixed.gguf", Ggml())


def test_the_file_holds_every_new_type(mixed_model):
    types = {info.qtype for info in read_gguf(mixed_model).tensors.values()}
    assert set(MATRIX_TYPES.values()) <= types


def test_cpu_decoder_runs_the_mixed_file_like_the_references(mixed_model):
    """Against the reference decoder running the same C products, the bounds of test_cpu_decoder's quantized
    models; against the NumPy backend (gguf's dequantizer, float activations) twice those: 8-bit activations
    against float ones move a random tiny model's logits by up to 6% of their range (7% for test_cpu_decoder's
    legacy / K-quant model too), while one wrong value per block moves the median alone past 1%."""
    gguf = read_gguf(mixed_model)
    config = ModelConfig.from_gguf(gguf)
    cpu, numpy_backend = CpuBackend(gguf, config), NumpyBackend(gguf, config)
    ids = np.random.default_rng(1).integers(0, N_VOCAB, 40).tolist()
    got = cpu.forward(ids, cpu.new_cache(64), all_logits=True)
    same_products = cpu.reference_forward(ids, NumpyKVCache(cpu.config, 64), all_logits=True)
    float_reference = numpy_backend.forward(ids, numpy_backend.new_cache(64), all_logits=True)
    assert got.shape == float_reference.shape == (40, N_VOCAB)
    for want, bound in ((same_products, 0.05), (float_reference, 0.1)):
        scale = np.abs(want).max()
        assert np.abs(got - want).max() < bound * scale
        assert np.median(np.abs(got - want)) < bound / 10 * scale
        assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9
