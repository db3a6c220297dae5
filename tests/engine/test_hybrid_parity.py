"""Parity with llama.cpp on synthetic hybrid Gated-DeltaNet models (qwen35, qwen35moe), quantized by llama.cpp.

The same criterion as the dense harness (test_arch_parity.py): the same argmax wherever llama.cpp's top-2 gap
is at least 0.5, and llama.cpp's top-10 logits matched within max(1.0, 5 % of the logits' std), over every
teacher-forced position. The sequence is fed as a prompt longer than one prefill chunk (512 tokens: the
recurrent state and the conv window carry across the chunk boundary), a second prompt piece, then single
decode steps; llama.cpp gets the same pieces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.backends.numpy_backend import PREFILL_CHUNK
from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from tests.engine.synthetic.hybrid import write_hybrid
from tests.engine.synthetic.quantize import quantize, tensor_types
from tests.engine.test_arch_parity import _make_backend

ARCHS = ("qwen35", "qwen35moe")
FILE_TYPES = {"F32": "F32", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}
BACKENDS = ("numpy", "cpu", "mlx")
N_CTX = 1024
PIECES = (PREFILL_CHUNK + 40, 24, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
SEQUENCE = np.random.default_rng(4321).integers(0, 267, sum(PIECES)).tolist()
CHECKED_FROM = len(SEQUENCE) - 96  # the last 96 positions (>= 48) are compared, after the chunk boundary too


def _pieces(ids: list[int]):
    start = 0
    for size in PIECES:
        yield ids[start:start + size]
        start += size


_FILES: dict[tuple[str, str], Path] = {}
_REFERENCE: dict[tuple[str, str], np.ndarray] = {}


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid")


def hybrid_file(directory: Path, arch: str, ftype: str) -> Path:
    """The synthetic ``arch`` model as llama.cpp quantizes it to ``ftype``, written once per session."""
    key = (arch, ftype)
    if key not in _FILES:
        src = directory / f"{arch}-F32.gguf"
        if not src.exists():
            write_hybrid(src, arch)
        _FILES[key] = src if ftype == "F32" else quantize(src, directory / f"{arch}-{ftype}.gguf", ftype)
    return _FILES[key]


def llama_cpp_logits(path: Path, key: tuple[str, str]) -> np.ndarray:
    if key not in _REFERENCE:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=512, logits_all=True, n_threads=2,
                              verbose=False)
        try:
            for piece in _pieces(SEQUENCE):
                llm.eval(piece)
            _REFERENCE[key] = np.array(llm.scores[:len(SEQUENCE)], dtype=np.float32)
        finally:
            llm.close()
    return _REFERENCE[key]


def our_logits(backend: str, path: Path) -> np.ndarray:
    gguf = read_gguf(path)
    model = _make_backend(backend, gguf, ModelConfig.from_gguf(gguf))
    cache = model.new_cache(N_CTX)
    return np.concatenate([model.forward(piece, cache, all_logits=True) for piece in _pieces(SEQUENCE)])


@pytest.mark.parametrize("ftype", list(FILE_TYPES))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_hybrid_logits_match_llama_cpp(hybrid_dir, backend, arch, ftype, record_property):
    path = hybrid_file(hybrid_dir, arch, ftype)
    held = tensor_types(path)
    assert FILE_TYPES[ftype] in held, f"llama.cpp's {ftype} file holds {held}, no {FILE_TYPES[ftype]}"
    ref = llama_cpp_logits(path, (arch, ftype))[CHECKED_FROM:]
    ours = our_logits(backend, path)[CHECKED_FROM:]
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
    assert error[worst] <= tolerance, (f"position {CHECKED_FROM + worst}: top-10 logits differ by {error[worst]:.3f} "
                                       f"(tolerance {tolerance:.2f}; file types {held})")
    assert mismatched.size == 0, f"argmax differs at positions {(mismatched + CHECKED_FROM).tolist()} ({held})"


# -- malformed hybrid models ------------------------------------------------------------------------------
def _load(path: Path):
    gguf = read_gguf(path)
    return _make_backend("numpy", gguf, ModelConfig.from_gguf(gguf))


@pytest.mark.parametrize("missing", ["blk.1.ssm_a", "blk.0.ssm_conv1d.weight", "blk.3.attn_q.weight",
                                     "blk.2.post_attention_norm.weight"])
def test_missing_hybrid_tensor_is_named(tmp_path, missing):
    path = write_hybrid(tmp_path / "m.gguf", drop=(missing,))
    with pytest.raises(ModelFormatError, match=missing.replace(".", r"\.")):
        _load(path)


def test_wrong_deltanet_shape_is_named(tmp_path):
    path = write_hybrid(tmp_path / "s.gguf", extra_tensors={"blk.0.ssm_out.weight": np.zeros((256, 128))})
    with pytest.raises(ModelFormatError, match=r"blk\.0\.ssm_out\.weight"):
        _load(path)


@pytest.mark.parametrize("key", ["qwen35.ssm.conv_kernel", "qwen35.ssm.state_size", "qwen35.ssm.group_count"])
def test_missing_ssm_metadata_is_named(tmp_path, key):
    path = write_hybrid(tmp_path / "k.gguf", drop=(key,))
    with pytest.raises(ModelFormatError, match=key.replace(".", r"\.")):
        _load(path)


def test_inconsistent_ssm_metadata_is_refused(tmp_path):
    path = write_hybrid(tmp_path / "i.gguf", metadata={"qwen35.ssm.inner_size": 200})
    with pytest.raises(ModelFormatError, match=r"ssm\.inner_size"):
        _load(path)


def test_unknown_tensor_in_hybrid_is_named(tmp_path):
    path = write_hybrid(tmp_path / "u.gguf", extra_tensors={"blk.1.ssm_d": np.zeros(4)})
    with pytest.raises(ModelFormatError, match=r"blk\.1\.ssm_d"):
        _load(path)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_a_multi_token_prediction_block_is_left_out_as_llama_cpp_does(tmp_path, arch, backend):
    """Qwen3.5 files carry a NextN block after the trunk (nextn_predict_layers); the main pass skips it."""
    import llama_cpp

    path = write_hybrid(tmp_path / f"{arch}-mtp.gguf", arch, mtp=True)
    ids = SEQUENCE[:48]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False)
    try:
        llm.eval(ids)
        ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    assert (config.n_layers, config.n_mtp_layers) == (4, 1)
    model = _make_backend(backend, gguf, config)
    ours = model.forward(ids, model.new_cache(256), all_logits=True)
    assert np.abs(ours - ref).max() < 0.05 and (ours.argmax(1) == ref.argmax(1)).all()
