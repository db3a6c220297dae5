"""gpt-oss end to end on a synthetic model: tight float32 parity with llama.cpp over a prefill longer than one
chunk and over decode steps that cross the sliding window, and the harmony chat format from a real gpt-oss
template with its analysis channel shown as thinking.

The quantized files (Q8_0, Q4_K_M, MXFP4_MOE) are held to the issue's criterion in test_arch_parity.py; here the
F32 file is held to 0.05, well under what each of gpt-oss's blocks moves the logits by when left out
(attention sinks 5.7, the SwiGLU clamp 0.8, the expert biases, the output bias), so each of them is checked.
Positions where some layer's router is at a near-tie (its chosen and first unchosen logits within
``NEAR_TIE``) are left out: there llama.cpp's float16 KV cache alone can choose the other expert (at 2 of
552 positions of the long prompt, in the last layer, the error reaches 1.6); they must stay few.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine.backends.mlx.moe
import engine.model
import engine.moe
from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import PREFILL_CHUNK, NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.reasoning import HARMONY, ReasoningSplitter, Split
from tests.engine.synthetic.specs import SLIDING_WINDOW, SPECS
from tests.engine.synthetic.writer import write_synthetic
from tests.llama_cpp_sources import chat_template

N_CTX = 1024
F32_TOLERANCE = 0.05
NEAR_TIE = 0.01  # router logits this close: the choice is decided by rounding
MAX_NEAR_TIES = 0.05  # at most this share of the positions may be left out (13 of 584 here)
LONG_PROMPT = np.random.default_rng(7).integers(0, 267, PREFILL_CHUNK + 40).tolist()  # more than one chunk
SHORT_PROMPT = LONG_PROMPT[:SLIDING_WINDOW // 2]  # decode steps from here cross the sliding window's edge
N_DECODE = 2 * SLIDING_WINDOW


@pytest.fixture(scope="module")
def gpt_oss_path(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf", SPECS["gpt-oss"])


def _pieces(prompt: list[int]) -> list[list[int]]:
    """The prompt in one piece, then ``N_DECODE`` single-token steps (teacher-forced)."""
    decode = np.random.default_rng(len(prompt)).integers(0, 267, N_DECODE).tolist()
    return [prompt] + [[t] for t in decode]


_REFERENCE: dict[int, np.ndarray] = {}


def _llama_cpp(path: Path, pieces: list[list[int]]) -> np.ndarray:
    key = len(pieces[0])
    if key not in _REFERENCE:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                              n_threads=2, verbose=False)
        try:
            for piece in pieces:
                llm.eval(piece)
            _REFERENCE[key] = np.array(llm.scores[:sum(map(len, pieces))], dtype=np.float32)
        finally:
            llm.close()
    return _REFERENCE[key]


def _backend(name: str, path: Path):
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    if name == "numpy":
        return NumpyBackend(gguf, config, n_ctx=N_CTX)
    if name == "cpu":
        return CpuBackend(gguf, config, n_ctx=N_CTX)
    import mlx.core as mx
    from engine.backends.mlx_backend import MlxBackend

    return MlxBackend(gguf, config, mx.float32, n_ctx=N_CTX)


def test_config_reads_gpt_oss(gpt_oss_path):
    c = ModelConfig.from_gguf(read_gguf(gpt_oss_path))
    assert (c.attn_sinks, c.attn_out_bias, c.moe_biases, c.activation, c.expert_gating) == \
        (True, True, True, "swiglu_oai", "softmax_weight")
    assert c.sliding_window == SLIDING_WINDOW
    assert [c.is_sliding(il) for il in range(c.n_layers)] == [True, False, True, False]  # even layers slide
    assert c.rope_scaling == "yarn" and c.rope_mscale > 1.0


class RouterGaps:
    """Wraps ``engine.moe.route`` to record, per call, each row's gap between the last chosen expert's and the
    first unchosen expert's selection value (the router logits, for gpt-oss's softmax_weight gating)."""

    def __init__(self):
        self.calls: list[np.ndarray] = []
        self._route = engine.moe.route

    def __call__(self, logits, config, selection_bias=None):
        ranked = np.sort(logits, axis=1)
        self.calls.append(ranked[:, -config.n_expert_used] - ranked[:, -config.n_expert_used - 1])
        return self._route(logits, config, selection_bias)

    def near_ties(self, n_layers: int) -> set[int]:
        """Positions (in forward order) where some layer's gap is below NEAR_TIE."""
        ties, start = set(), 0
        for first in range(0, len(self.calls), n_layers):
            layers = self.calls[first:first + n_layers]
            ties.update(start + int(r) for gaps in layers for r in np.flatnonzero(gaps < NEAR_TIE))
            start += len(layers[0])
        return ties


@pytest.mark.parametrize("backend", ["numpy", "cpu", "mlx"])
@pytest.mark.parametrize("prompt", [LONG_PROMPT, SHORT_PROMPT], ids=["long-prefill", "decode-across-window"])
def test_f32_logits_match_llama_cpp_closely(gpt_oss_path, backend, prompt, monkeypatch):
    pieces = _pieces(prompt)
    ref = _llama_cpp(gpt_oss_path, pieces)
    model = _backend(backend, gpt_oss_path)
    gaps = RouterGaps()
    monkeypatch.setattr(engine.moe, "route", gaps)
    monkeypatch.setattr(engine.backends.mlx.moe, "route", gaps)
    cache = model.new_cache(N_CTX)
    ours = np.concatenate([model.forward(piece, cache, all_logits=True) for piece in pieces])
    assert ours.shape == ref.shape
    assert ref.std(axis=1).mean() >= 2.0
    ties = gaps.near_ties(model.config.n_layers)
    assert len(ties) <= MAX_NEAR_TIES * len(ref), f"router near-ties at {sorted(ties)}"
    kept = np.array([p for p in range(len(ref)) if p not in ties])
    error = np.abs(ours - ref).max(axis=1)[kept]
    worst = int(kept[error.argmax()])
    assert error.max() <= F32_TOLERANCE, f"position {worst} of {len(ref)}: logits differ by {error.max():.4f}"
    assert (ours.argmax(axis=1) == ref.argmax(axis=1))[kept].all()


HARMONY_REPLY = ("<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final"
                 "<|message|>Hello!")


def test_harmony_template_renders_and_its_analysis_channel_is_thinking(tmp_path):
    path = write_synthetic(tmp_path / "chat.gguf", SPECS["gpt-oss"],
                           metadata={"tokenizer.chat_template": chat_template("openai-gpt-oss-120b")})
    model = engine.model.load(path, backend="numpy", n_ctx=256)
    try:
        prompt = model.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        assert model.reasoning.syntax == HARMONY
    finally:
        model.close()
    assert "<|start|>user<|message|>Hi<|end|>" in prompt
    assert prompt.endswith("<|start|>assistant")
    splitter = ReasoningSplitter(HARMONY)
    splitter.feed(HARMONY_REPLY)
    splitter.finish()
    assert splitter.split() == Split("The user greets me.", "Hello!", False)
