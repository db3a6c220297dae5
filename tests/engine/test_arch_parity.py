"""Parity with llama.cpp on synthetic models of every architecture, quantized by llama.cpp's own quantizer.

For each architecture variant x llama.cpp file type x backend, llama.cpp (llama-cpp-python) and our backend
evaluate the same fixed id sequence teacher-forced, in the same pieces (a first prompt chunk, the rest of the
prompt, then single-token decode steps, so the cache path is exercised), with every position's logits kept.
Criterion: the same argmax wherever llama.cpp's top-2 gap is at least 0.5, and llama.cpp's top-10 logits
matched within max(1.0, 5 % of the logits' standard deviation). The sequence is longer than the sliding
window (gemma2) and than the original contexts of the YaRN, LongRoPE and temperature-tuning variants.

A test per architecture also checks that a missing tensor or metadata key, or a tensor we do not implement,
gives a ModelFormatError naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from tests.engine.synthetic.quantize import quantize, tensor_types
from tests.engine.synthetic.specs import SPECS, N_LAYERS
from tests.engine.synthetic.writer import write_synthetic

# The backends under test. "mlx" computes in float32 (its default on the CPU); "mlx-f16" (float16, a Mac GPU's
# default) is held to the NumPy reference on the same models in test_mlx_architectures.py and runs here on request
# (HEARTH_PARITY_MLX_F16=1): 192 more cases, about 8 minutes of CI on two cores.
BACKENDS = ("numpy", "cpu", "mlx") + (("mlx-f16",) if os.environ.get("HEARTH_PARITY_MLX_F16") else ())
# llama.cpp file types (LLAMA_FTYPE_MOSTLY_*) and the GGML type each must really put in the file.
# Left out: IQ2_XXS/IQ2_XS/IQ2_S/IQ2_M, IQ3_XXS/IQ3_XS and IQ1_S/IQ1_M (llama.cpp refuses them without an
# importance matrix). MXFP4_MOE quantizes only expert tensors (a dense model comes out all Q8_0): it runs for the
# mixture-of-experts specs that list it in their ``file_types``, and only those.
FILE_TYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K",
              "Q6_K": "Q6_K", "Q3_K_M": "Q3_K", "Q2_K": "Q2_K", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS",
              "IQ3_S": "IQ3_S", "MXFP4_MOE": "MXFP4"}
DENSE_FILE_TYPES = tuple(t for t in FILE_TYPES if t != "MXFP4_MOE")
# Per backend, file types its kernels do not read yet: those combinations are not generated (they would fail).
BACKEND_EXCLUDED_TYPES: dict[str, set[str]] = {"numpy": set(), "cpu": set(), "mlx": set(), "mlx-f16": set()}

N_CTX = 256  # llama.cpp rounds a context up to a multiple of 256; the LongRoPE choice depends on it
SEQUENCE = np.random.default_rng(1234).integers(0, 267, 64).tolist()
PIECES = (20, 36, 1, 1, 1, 1, 1, 1, 1, 1)  # prompt chunk, rest of the prompt, then decode steps
assert sum(PIECES) == len(SEQUENCE)


def _pieces(ids: list[int]):
    start = 0
    for size in PIECES:
        yield ids[start:start + size]
        start += size


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic")


_FILES: dict[tuple[str, str], Path] = {}
_REFERENCE: dict[tuple[str, str], np.ndarray] = {}


def model_file(directory: Path, name: str, ftype: str) -> Path:
    """The synthetic model ``name`` as llama.cpp quantizes it to ``ftype``, written once per session."""
    key = (name, ftype)
    if key not in _FILES:
        src = directory / f"{name}-F32.gguf"
        if not src.exists():
            write_synthetic(src, SPECS[name])
        _FILES[key] = src if ftype == "F32" else quantize(src, directory / f"{name}-{ftype}.gguf", ftype)
    return _FILES[key]


def llama_cpp_logits(path: Path, key: tuple[str, str]) -> np.ndarray:
    """llama.cpp's logits (len(SEQUENCE), n_vocab) for SEQUENCE fed in PIECES, computed once per file."""
    if key not in _REFERENCE:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, logits_all=True, n_threads=2, verbose=False)
        try:
            for piece in _pieces(SEQUENCE):
                llm.eval(piece)
            _REFERENCE[key] = np.array(llm.scores[:len(SEQUENCE)], dtype=np.float32)
        finally:
            llm.close()
    return _REFERENCE[key]


def our_logits(backend: str, path: Path) -> np.ndarray:
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    model = _make_backend(backend, gguf, config)
    cache = model.new_cache(N_CTX)
    return np.concatenate([model.forward(piece, cache, all_logits=True) for piece in _pieces(SEQUENCE)])


def _make_backend(backend: str, gguf, config):
    if backend == "numpy":
        return NumpyBackend(gguf, config, n_ctx=N_CTX)
    if backend == "cpu":
        return CpuBackend(gguf, config, n_ctx=N_CTX)
    if backend in ("mlx", "mlx-f16"):
        import mlx.core as mx
        from engine.backends.mlx_backend import MlxBackend

        return MlxBackend(gguf, config, mx.float16 if backend == "mlx-f16" else mx.float32, n_ctx=N_CTX)
    raise AssertionError(f"add backend {backend!r} to _make_backend")


# Known misses of the criterion, with the numbers measured; strict, so a fix shows up as a failure to update.
KNOWN_MISSES = {
    # llama.cpp's IQ3_S products round the activations to 8 bits, the float reference does not: at position 56
    # llama.cpp's top two (gap 0.58) move by -0.27 and +0.37 and swap; the top-10 logits stay within 0.52.
    ("numpy", "phi3", "IQ3_S"): "argmax swaps at one position with a top-2 gap of 0.58 (IQ3_S activation rounding)",
    # MLX holds IQ3_S exactly (float weights, like the NumPy reference) and swaps at the same position 56.
    ("mlx", "phi3", "IQ3_S"): "argmax swaps at position 56 (top-2 gap 0.58), as the float NumPy reference does",
    ("mlx-f16", "phi3", "IQ3_S"): "argmax swaps at position 56 (top-2 gap 0.58), as the float NumPy reference does",
    # The C backend at position 43: llama.cpp's top two are 11.594 and 11.049 (gap 0.545); ours 11.442 and 11.514
    # (the second +0.47, the first -0.15), so they swap; the NumPy reference (float weights) keeps the order.
    ("cpu", "smollm3", "IQ3_S"): "argmax swaps at one position with a top-2 gap of 0.545 (C IQ3_S products)",
    # A router near-tie: at position 12 of layer 0 the second and third experts' probabilities differ by < 5e-5,
    # so rounding differences choose another expert there (and later positions attend to it): top-10 logits
    # differ by up to 1.39 (numpy), 1.09 at position 29 (cpu) and 1.40 (mlx, mlx-f16) against a tolerance of 1.0.
    ("numpy", "qwen3moe", "Q5_K_M"): "router near-tie at position 12 picks another expert (top-10 error 1.39)",
    ("cpu", "qwen3moe", "Q5_K_M"): "router near-tie at position 12 picks another expert (top-10 error 1.09)",
    ("mlx", "qwen3moe", "Q5_K_M"): "router near-tie at position 12 picks another expert (top-10 error 1.40)",
    ("mlx-f16", "qwen3moe", "Q5_K_M"): "router near-tie at position 12 picks another expert (top-10 error 1.40)",
    # Router near-ties in gpt-oss. Q8_0: at position 3 of the last layer the second and third router logits differ
    # by 0.018; llama.cpp's 8-bit rounding of the activations picks the third expert, and so do the C kernels
    # (which round the same way), the float backends the second: top-10 error 1.26 (1.25 in float16) at position
    # 3 (0.14 when the third expert is forced there).
    ("numpy", "gpt-oss", "Q8_0"): "router near-tie (gap 0.018) at position 3 picks another expert (error 1.26)",
    ("mlx", "gpt-oss", "Q8_0"): "router near-tie (gap 0.018) at position 3 picks another expert (error 1.26)",
    ("mlx-f16", "gpt-oss", "Q8_0"): "router near-tie (gap 0.018) at position 3 picks another expert (error 1.25)",
    # Q4_K_M on the C kernels: at position 7 of the last layer their products (Q4_K x Q8_K, 0.8 % off the float
    # ones) leave the second and third router logits 0.005 apart and pick expert 6 where the float reference
    # (gap 0.16) and llama.cpp pick expert 3; llama.cpp's top two there (7.74, 7.12) become 7.19 and 7.37: the
    # argmax swaps, top-10 error 0.83. The NumPy and MLX backends pass this file.
    ("cpu", "gpt-oss", "Q4_K_M"): "router near-tie (gap 0.005) at position 7 of the last layer: argmax swaps",
}


def _cases():
    for backend in BACKENDS:
        for name, spec in SPECS.items():
            for ftype in spec.file_types or DENSE_FILE_TYPES:
                if ftype in BACKEND_EXCLUDED_TYPES[backend]:
                    continue
                miss = KNOWN_MISSES.get((backend, name, ftype))
                marks = [pytest.mark.xfail(strict=True, reason=miss)] if miss else []
                yield pytest.param(backend, name, ftype, id=f"{backend}-{name}-{ftype}", marks=marks)


@pytest.mark.parametrize(("backend", "name", "ftype"), list(_cases()))
def test_logits_match_llama_cpp(synthetic_dir, backend, name, ftype, record_property):
    path = model_file(synthetic_dir, name, ftype)
    held = tensor_types(path)
    record_property("tensor_types", held)
    assert FILE_TYPES[ftype] in held, f"llama.cpp's {ftype} file holds {held}, no {FILE_TYPES[ftype]}"
    ref = llama_cpp_logits(path, (name, ftype))
    ours = our_logits(backend, path)
    assert ours.shape == ref.shape

    std = float(ref.std(axis=1).mean())
    assert std >= 2.0, f"the synthetic model's logits are too flat to test (std {std:.2f})"
    tolerance = max(1.0, 0.05 * std)
    top10 = np.argsort(ref, axis=1)[:, -10:]
    error = np.abs(np.take_along_axis(ours, top10, 1) - np.take_along_axis(ref, top10, 1)).max(axis=1)
    worst = int(error.argmax())
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= 0.5
    mismatched = np.flatnonzero(clear & (ours.argmax(axis=1) != ref.argmax(axis=1)))
    record_property("numbers", f"std {std:.2f} top10_err {error[worst]:.3f} tol {tolerance:.2f} "
                               f"clear {int(clear.sum())} argmax_mismatch {mismatched.size}")
    assert error[worst] <= tolerance, (f"position {worst}: top-10 logits differ by {error[worst]:.3f} "
                                       f"(tolerance {tolerance:.2f}; file types {held})")
    assert mismatched.size == 0, f"argmax differs at positions {mismatched.tolist()} (file types {held})"


@pytest.mark.parametrize("name", list(SPECS))
def test_batched_decode_matches_one_sequence_at_a_time(synthetic_dir, name):
    """forward_batch (the scheduler's path) reads the same fields as forward: two sequences at different positions."""
    gguf = read_gguf(model_file(synthetic_dir, name, "F32"))
    model = NumpyBackend(gguf, ModelConfig.from_gguf(gguf), n_ctx=N_CTX)
    prompts = (SEQUENCE[:40], SEQUENCE[10:31])  # past the sliding window and the original contexts
    caches, alone = [], []
    for prompt in prompts:
        cache = model.new_cache(N_CTX)
        model.forward(prompt, cache)
        caches.append(cache)
        single = model.new_cache(N_CTX)
        model.forward(prompt, single)
        alone.append(model.forward([7], single))
    batched = model.forward_batch([7, 7], caches)
    np.testing.assert_allclose(batched, np.stack(alone), atol=2e-3, rtol=1e-4)
    assert [c.n_past for c in caches] == [41, 22]


# -- malformed models ----------------------------------------------------------------------------------------
def _load(path: Path) -> NumpyBackend:
    gguf = read_gguf(path)
    return NumpyBackend(gguf, ModelConfig.from_gguf(gguf), n_ctx=N_CTX)


def _required_tensor(name: str) -> str:
    spec = SPECS[name]
    return "blk.2.attn_qkv.weight" if spec.fused_qkv else "blk.2.attn_k.weight"


@pytest.mark.parametrize("name", list(SPECS))
def test_missing_tensor_is_named(tmp_path, name):
    missing = _required_tensor(name)
    path = write_synthetic(tmp_path / "m.gguf", SPECS[name], drop=(missing,))
    with pytest.raises(ModelFormatError, match=missing.replace(".", r"\.")):
        _load(path)


@pytest.mark.parametrize("name", list(SPECS))
def test_unimplemented_tensor_is_named(tmp_path, name):
    """llama.cpp takes an optional attn_output.bias (llama, mistral3, granite ...); we do not: refuse it. gpt-oss
    has that bias, and its FFN norm is stored as post_attention_norm: a stray ffn_norm is refused there."""
    unused = "ffn_norm.weight" if SPECS[name].attn_out_bias else "attn_output.bias"
    extra = {f"blk.{N_LAYERS - 1}.{unused}": np.zeros(256)}
    path = write_synthetic(tmp_path / "u.gguf", SPECS[name], extra_tensors=extra)
    with pytest.raises(ModelFormatError, match=unused.replace(".", r"\.")):
        _load(path)


@pytest.mark.parametrize("name", list(SPECS))
def test_missing_metadata_is_named(tmp_path, name):
    spec = SPECS[name]
    key = f"{spec.arch}.logit_scale" if spec.arch == "granite" else f"{spec.arch}.block_count"
    path = write_synthetic(tmp_path / "k.gguf", spec, drop=(key,))
    with pytest.raises(ModelFormatError, match=key.replace(".", r"\.")):
        _load(path)


@pytest.mark.parametrize("name", list(SPECS))
def test_wrong_shape_is_named(tmp_path, name):
    spec = SPECS[name]
    target = "blk.1.ffn_down.weight"
    path = write_synthetic(tmp_path / "s.gguf", spec, extra_tensors={target: np.zeros((256, 256))})
    with pytest.raises(ModelFormatError, match=target.replace(".", r"\.")):
        _load(path)
