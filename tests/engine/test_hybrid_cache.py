"""The hybrid (Gated DeltaNet) cache on every backend: roll-back, prefix reuse, batching, speculation, sessions.

A recurrent state cannot be cut back, so ``truncate`` restores a checkpoint and replays what follows it
(engine/hybrid_cache.py). Each test holds the result to a fresh computation of the same tokens: the solo
greedy tokens of each sequence for batched and speculative decoding, the uninterrupted continuation for a
session restored in another process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine.model
from engine.generate import GenerationEvent, generate_step
from engine.hybrid_cache import MAX_ANCHORS, ROLLBACK_TOKENS
from engine.sampling import SamplingParams, make_sampler
from engine.scheduler import Scheduler
from engine.sequence import Request
from engine.speculative import prompt_lookup_speculator
from engine.thermal.policy import Limits
from tests.engine.synthetic.hybrid import write_hybrid

BACKENDS = ("numpy", "cpu", "mlx")
GREEDY = SamplingParams(temperature=0.0)
N_CTX = 512
PROMPT = np.random.default_rng(77).integers(0, 267, 40).tolist()


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory) -> Path:
    return write_hybrid(tmp_path_factory.mktemp("hybrid-cache") / "qwen35.gguf", "qwen35", seed=3)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, hybrid_path):
    m = engine.model.load(hybrid_path, backend=request.param, n_ctx=N_CTX)
    yield m
    m.close()


def _fresh_logits(model, pieces: list[list[int]]) -> np.ndarray:
    cache = model.backend.new_cache(N_CTX)
    for piece in pieces:
        logits = model.backend.forward(piece, cache)
    return logits


class _ReplaySpy:
    """Wraps a cache's replay callback and records what it replays."""

    def __init__(self, cache):
        self.calls: list[list[int]] = []
        self._inner = cache._replay
        cache._replay = self

    def __call__(self, cache, tokens):
        self.calls.append(list(tokens))
        self._inner(cache, tokens)


def test_rolling_back_a_verify_pass_is_exact_and_replays_nothing(model):
    backend = model.backend
    cache = backend.new_cache(N_CTX)
    backend.forward(PROMPT, cache)
    drafted = [11, 12, 13, 14, 15, 16]
    verified = backend.forward(drafted, cache, all_logits=True)
    spy = _ReplaySpy(cache)
    cache.truncate(len(PROMPT) + 2)  # two drafts accepted: the state after them is a checkpoint
    assert spy.calls == [] and cache.n_past == len(PROMPT) + 2
    after = backend.forward([99], cache)
    expected = _fresh_logits(model, [PROMPT, drafted[:2], [99]])
    np.testing.assert_allclose(after, expected, atol=1e-4)
    np.testing.assert_allclose(verified[1], _fresh_logits(model, [PROMPT, drafted[:2]]), atol=1e-4)


def test_rolling_back_to_the_prompt_uses_its_anchor_and_deeper_replays(model):
    backend = model.backend
    cache = backend.new_cache(N_CTX)
    backend.forward(PROMPT, cache)
    for token in (3, 4, 5, 6):
        backend.forward([token], cache)
    spy = _ReplaySpy(cache)
    cache.truncate(len(PROMPT))  # the prompt (longer than ROLLBACK_TOKENS) ended at an anchor
    assert spy.calls == [] and len(PROMPT) > ROLLBACK_TOKENS
    np.testing.assert_allclose(backend.forward([7], cache), _fresh_logits(model, [PROMPT, [7]]), atol=1e-4)
    cache.truncate(25)  # no checkpoint there: the state is rebuilt from position 0
    assert spy.calls == [PROMPT[:25]] and cache.n_past == 25
    np.testing.assert_allclose(backend.forward([8], cache), _fresh_logits(model, [PROMPT[:25], [8]]), atol=1e-4)


def test_anchors_are_bounded(model):
    backend = model.backend
    cache = backend.new_cache(N_CTX)
    for i in range(MAX_ANCHORS + 3):
        backend.forward(PROMPT[:ROLLBACK_TOKENS + 1], cache)
    assert len(cache.recurrent._anchors) == MAX_ANCHORS


def test_prefix_reuse_through_the_model_gives_fresh_results(model):
    first = [e.id for e in model.generate_ids(PROMPT, GREEDY, 6)]
    edited = PROMPT[:30] + [1, 2, 3]  # an edited last message: the cache goes back to position 30
    reused = [e.id for e in model.generate_ids(edited, GREEDY, 6)]
    regenerated = [e.id for e in model.generate_ids(PROMPT, GREEDY, 6)]
    fresh = engine.model.load(model.path, backend=model.backend.name, n_ctx=N_CTX)
    try:
        assert reused == [e.id for e in fresh.generate_ids(edited, GREEDY, 6)]
    finally:
        fresh.close()
    assert regenerated == first


def _solo(model, prompt: list[int], n: int) -> list[int]:
    cache = model.backend.new_cache(N_CTX)
    steps = generate_step(model.backend, cache, list(prompt), make_sampler(GREEDY), list(prompt))
    out = [t for _, (t, _) in zip(range(n), steps)]
    steps.close()
    return out


def test_batched_decode_of_four_sequences_gives_each_its_solo_tokens(model):
    prompts = [PROMPT[:9], PROMPT[5:30], PROMPT[:3], PROMPT[10:40]]
    batches = []
    inner = model.backend.forward_batch

    def spy(tokens, caches):
        batches.append(len(caches))
        return inner(tokens, caches)

    model.backend.forward_batch = spy
    try:
        scheduler = Scheduler(model.backend, n_ctx=N_CTX, limits=Limits(prefill_chunk=512, max_batch=8, pause_s=0.0))
        handles = [scheduler.submit(Request(tuple(p), make_sampler(GREEDY), max_tokens=8, params=GREEDY), queued=False)
                   for p in prompts]
        tokens = {h.id: [] for h in handles}
        while scheduler.has_work:
            for rid, event in scheduler.step().events:
                if isinstance(event, GenerationEvent):
                    tokens[rid].append(event.id)
    finally:
        del model.backend.forward_batch
    assert max(batches) == 4
    for handle, prompt in zip(handles, prompts):
        assert tokens[handle.id] == _solo(model, prompt, 8)


def test_prompt_lookup_speculation_gives_the_solo_greedy_tokens(model):
    repeating = PROMPT[:12] * 3
    plain = _solo(model, repeating, 40)
    spec = prompt_lookup_speculator(6, adaptive=False)
    cache = model.backend.new_cache(N_CTX)
    steps = spec.generate_step(model.backend, cache, list(repeating), make_sampler(GREEDY), list(repeating),
                               params=GREEDY)
    ours = [t for _, (t, _) in zip(range(40), steps)]
    steps.close()
    assert ours == plain
    assert spec.stats.verify_passes > 0 and spec.stats.proposed > spec.stats.accepted  # drafts were rejected too


_CONTINUE = """
import json, sys
import engine.model
from engine.sampling import SamplingParams
path, backend, session = sys.argv[1:4]
m = engine.model.load(path, backend=backend, n_ctx={n_ctx})
s = m.load_session(session)
print(json.dumps([e.id for e in m.generate_ids(s.tokens, SamplingParams(temperature=0.0), 7)]))
"""


def test_a_session_restores_and_continues_token_identically_in_a_new_process(model, tmp_path):
    uninterrupted = [e.id for e in model.generate_ids(PROMPT, GREEDY, 12)]
    first = [e.id for e in model.generate_ids(PROMPT, GREEDY, 5)]
    path = tmp_path / "hybrid.hearth"
    saved = model.save_session(path)
    assert saved.kv.recurrent is not None and len(saved.kv.recurrent) == 2 * len(model.config.recurrent_layers)
    proc = subprocess.run([sys.executable, "-c", _CONTINUE.format(n_ctx=N_CTX), str(model.path),
                           model.backend.name, str(path)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert first + json.loads(proc.stdout.strip().splitlines()[-1]) == uninterrupted


def test_a_restored_session_cannot_replay_unknown_tokens_but_the_model_starts_afresh(model, tmp_path):
    [e.id for e in model.generate_ids(PROMPT, GREEDY, 3)]
    model.save_session(tmp_path / "s.hearth")
    cache = model.backend.new_cache(N_CTX)
    cache.import_state(model._cache.export_state())
    with pytest.raises(ValueError, match="recurrent state cannot go back"):
        cache.truncate(10)
    model.load_session(tmp_path / "s.hearth")
    edited = PROMPT[:10] + [4, 4]
    assert [e.id for e in model.generate_ids(edited, GREEDY, 4)] == _solo(model, edited, 4)


def test_memory_figures_count_kv_of_attention_layers_and_the_recurrent_states(model, hybrid_path):
    from engine.deltanet import recurrent_state_bytes
    from engine.gguf_file import read_gguf
    from engine.memory_estimate import RECURRENT_STATE_COPIES, estimate_memory

    c = model.config
    n_attention = c.n_layers - len(c.recurrent_layers)
    assert 0 < n_attention < c.n_layers
    state = recurrent_state_bytes(c)
    assert state == 4 * len(c.recurrent_layers) * ((c.ssm_d_conv - 1) * c.ssm_conv_dim
                                                   + c.ssm_n_v_heads * c.ssm_d_state * c.ssm_head_v_dim)
    cache = model.backend.new_cache(N_CTX)
    cache.reserve(N_CTX)
    # NumPy and the CPU reference path keep keys and values in float32, MLX in its matmul dtype
    element = model.backend.dtype.size if model.backend.name == "mlx" else 4
    assert cache.nbytes == n_attention * c.n_kv_heads * (c.head_dim + c.v_head_dim) * N_CTX * element + state
    usage = model.kv_cache_usage
    assert usage.bytes_per_position == n_attention * c.n_kv_heads * (c.head_dim + c.v_head_dim) * element
    estimate = estimate_memory(read_gguf(hybrid_path), N_CTX, "numpy")
    assert estimate.kv_cache_bytes == usage.bytes_per_position * N_CTX + state * RECURRENT_STATE_COPIES


def test_a_session_whose_recurrent_states_do_not_fit_is_refused(model, tmp_path):
    from engine.deltanet import recurrent_state_shapes
    from engine.session import SessionError, load_session

    [e.id for e in model.generate_ids(PROMPT[:8], GREEDY, 2)]
    path = tmp_path / "s.hearth"
    model.save_session(path)
    c = model.config
    kv_shape = (c.n_kv_heads, c.head_dim, c.v_head_dim)
    shapes = list(recurrent_state_shapes(c)) * len(c.recurrent_layers)
    assert load_session(path, model.sha256, c.n_layers, kv_shape, c.recurrent_layers, shapes).kv.recurrent
    with pytest.raises(SessionError, match="recurrent state array 1 has the wrong shape"):
        load_session(path, model.sha256, c.n_layers, kv_shape, c.recurrent_layers,
                     [shapes[0], (1, 2, 3)] + shapes[2:])
    with pytest.raises(SessionError, match="recurrent state arrays"):
        load_session(path, model.sha256, c.n_layers, kv_shape, c.recurrent_layers, shapes[:2])
    with pytest.raises(SessionError, match="KV arrays of layer 0"):  # a dense model's view of the same file
        load_session(path, model.sha256, c.n_layers, kv_shape)
