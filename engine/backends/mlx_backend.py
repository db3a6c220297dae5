"""The MLX backend: one decoder for every architecture, read from ModelConfig, on MLX (Metal on a Mac, CPU elsewhere).

Weights stay quantized: GGUF blocks are repacked into MLX affine quantization at load (mlx/repack.py) and
multiplied with ``mx.quantized_matmul``. Norms, RoPE and attention use ``mx.fast`` kernels. The residual
stream is float32; matrix products, attention and the KV cache run in ``self.dtype``, chosen per model and device
by mlx_compute.choose_for_file (float32 on MLX's CPU device; on the GPU float16 unless the model needs more).

Architecture differences are small optional steps the one decoder takes when ModelConfig asks: pre-norms or
none, per-head or whole-projection q/k norms, RoPE per layer from ``rope.rope_tables`` (``mx.fast.rope`` with
the periods of the layer's set, times ``rope_mscale``; none on no-RoPE layers), temperature tuning of the
queries, residual, logit and soft-cap scaling. Soft-capped attention scores (Gemma 2) take an explicit
attention path, since MLX's fused kernel has no soft-cap; every other model uses the fused kernel. Fused
GGUF tensors (phi3's attn_qkv, gate+up) load once and their parts are row slices of the same arrays.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from functools import partial
from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

from ..config import ModelConfig
from ..generate import prefill
from ..memory_estimate import active_weight_fraction
from ..gguf_file import GGUFFile, ModelFormatError
from ..model_tensors import TensorRef, layer_tensor_names, output_tensor_name
from ..rope import attn_temperature, rope_tables
from . import platform_mlx
from .base import Backend, KVCache, MemoryStats
from .mlx.deltanet import MlxHybridCache, load_mlx_deltanet, mlx_deltanet
from .mlx.kv_cache import MAX_CHUNK, MlxKVCache
from .mlx.moe import moe_ffn, swiglu_oai_gated
from .mlx.weights import RESIDUAL_DTYPE, Matrix, TensorReader, load_matrix, load_vector, mlx_weight_bytes
from .mlx_compute import ComputeDtype, choose_for_file

GELU_COEF = 0.7978845608028654  # sqrt(2 / pi)


@dataclasses.dataclass
class LayerWeights:
    """One decoder block; matrices are (out, in) like GGUF rows."""

    attn_norm: mx.array | None  # (n_embd,); None without pre-norms (OLMo 2)
    wq: Matrix  # (n_heads * head_dim, n_embd)
    wk: Matrix  # (n_kv_heads * head_dim, n_embd)
    wv: Matrix  # (n_kv_heads * v_head_dim, n_embd)
    wo: Matrix  # (n_embd, n_heads * v_head_dim)
    ffn_norm: mx.array | None  # (n_embd,)
    w_gate: Matrix | None  # (n_ff, n_embd); None in a mixture-of-experts model
    w_up: Matrix | None  # (n_ff, n_embd)
    w_down: Matrix | None  # (n_embd, n_ff)
    bq: mx.array | None = None  # (n_heads * head_dim,)
    bk: mx.array | None = None
    bv: mx.array | None = None
    q_norm: mx.array | None = None  # (head_dim,) per head, or (n_heads * head_dim,) with qk_norm_whole
    k_norm: mx.array | None = None  # (head_dim,) or (n_kv_heads * head_dim,)
    post_attn_norm: mx.array | None = None  # (n_embd,)
    post_ffn_norm: mx.array | None = None
    # mixture of experts (ModelConfig.n_expert > 0) in place of w_gate / w_up / w_down:
    w_router: Matrix | None = None  # (n_expert, n_embd)
    w_gate_exps: Matrix | None = None  # (n_expert * n_ff_exp, n_embd): expert e is rows e * n_ff_exp ...
    w_up_exps: Matrix | None = None  # (n_expert * n_ff_exp, n_embd)
    w_down_exps: Matrix | None = None  # (n_expert * n_embd, n_ff_exp)
    b_router: mx.array | None = None  # (n_expert,) (gpt-oss's biases; engine/backends/mlx/moe.py uses them)
    b_gate_exps: mx.array | None = None  # (n_expert * n_ff_exp,)
    b_up_exps: mx.array | None = None  # (n_expert * n_ff_exp,)
    b_down_exps: mx.array | None = None  # (n_expert * n_embd,)
    exp_probs_b: mx.array | None = None  # (n_expert,)
    w_gate_shexp: Matrix | None = None  # (n_ff_shexp, n_embd): the shared expert
    w_up_shexp: Matrix | None = None
    w_down_shexp: Matrix | None = None  # (n_embd, n_ff_shexp)
    w_gate_inp_shexp: mx.array | None = None  # (n_embd,)
    bo: mx.array | None = None  # (n_embd,) attn_output.bias
    attn_sinks: mx.array | None = None  # (n_heads,) per-head sink logits (gpt-oss)
    deltanet: object = None  # a hybrid model's recurrent layer: mlx.deltanet.MlxDeltaNet in place of attention
    # gemma4 (engine.gemma4): wk / wv / k_norm are None in a layer that reads another layer's cache
    out_scale: mx.array | None = None  # (1,) the layer's output multiplier
    ple_gate: Matrix | None = None  # (n_embd_per_layer, n_embd): the per-layer embedding's gate
    ple_proj: Matrix | None = None  # (n_embd, n_embd_per_layer)
    ple_norm: mx.array | None = None  # (n_embd,)
    router_scale: mx.array | None = None  # (n_embd,) gemma4 with experts: the router input's scale
    pre_ffn_norm_2: mx.array | None = None  # (n_embd,) the experts' input norm
    post_ffn_norm_1: mx.array | None = None  # (n_embd,) the dense FFN's output norm
    post_ffn_norm_2: mx.array | None = None  # (n_embd,) the experts' output norm
    down_exps_scale: mx.array | None = None  # (n_expert,)


MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "w_router", "w_gate_exps", "w_up_exps",
                 "w_down_exps", "w_gate_shexp", "w_up_shexp", "w_down_shexp", "ple_gate", "ple_proj")
# vectors applied to matrix-product outputs, so held in the matmul dtype; the others act on the residual stream
MATMUL_SIDE_VECTORS = ("bq", "bk", "bv", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "bo", "attn_sinks",
                       "b_gate_exps", "b_up_exps")


@partial(mx.compile, shapeless=True)
def silu_gated(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up as one fused kernel, computed in float32 (gate³ and products overflow float16)."""
    g, u = gate.astype(mx.float32), up.astype(mx.float32)
    return (g * mx.sigmoid(g) * u).astype(gate.dtype)


@partial(mx.compile, shapeless=True)
def gelu_tanh_gated(gate: mx.array, up: mx.array) -> mx.array:
    """gelu_tanh(gate) * up as one fused kernel, computed in float32."""
    g, u = gate.astype(mx.float32), up.astype(mx.float32)
    return (0.5 * g * (1.0 + mx.tanh(GELU_COEF * (g + 0.044715 * g * g * g))) * u).astype(gate.dtype)


GATED_ACTIVATIONS = {"silu": silu_gated, "gelu_tanh": gelu_tanh_gated, "swiglu_oai": swiglu_oai_gated}


def _device_argmax(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class MlxBackend(Backend):
    """The decoder on MLX arrays. ``forward`` returns NumPy float32 logits like every backend."""

    name = "mlx"
    kv_sliding_rings = True
    pipelined_greedy = True

    def __init__(self, gguf: GGUFFile, config: ModelConfig, matmul_dtype: mx.Dtype | None = None,
                 n_ctx: int | None = None):
        """Load and repack the weights.

        Args:
            matmul_dtype: the dtype of matrix-product inputs, attention and the KV cache; by default the one
                ``mlx_compute.choose_for_file`` picks for this model on MLX's default device.
            n_ctx: the context size the model is loaded for; only LongRoPE models depend on it (see
                ``rope.rope_tables``). None: within the model's original context.

        Raises:
            ModelDoesNotFitError: the weights would not fit in what the device can keep resident.
            ModelFormatError: a tensor has a type or shape this backend cannot use.
        """
        self.config = config
        if matmul_dtype is None:
            self.compute = choose_for_file(gguf, config, platform_mlx.default_device_is_gpu())
        else:
            self.compute = ComputeDtype(str(matmul_dtype).removeprefix("mlx.core."), "set by the caller")
        self.compute_note = f"MLX compute {self.compute.describe()}"
        self.dtype = getattr(mx, self.compute.name)
        weight_bytes = mlx_weight_bytes(gguf)
        platform_mlx.check_fits(weight_bytes, gguf.path.name)
        reader = TensorReader(gguf)
        try:
            self.layers = [self._load_layer(reader, i) for i in range(config.n_layers)]
            self.output_norm = load_vector(reader, "output_norm.weight")  # (n_embd,)
            output = output_tensor_name(gguf, config)
            tied = output == "token_embd.weight"
            self.token_embd = load_matrix(reader, "token_embd.weight")  # (n_vocab, n_embd)
            self.output = self.token_embd if tied else load_matrix(reader, output)
            self.per_layer = self._load_per_layer(reader) if config.n_embd_per_layer else None
        finally:
            reader.close()
        self._rope_tables(gguf, n_ctx)
        self.active_weight_fraction = active_weight_fraction(gguf, config)  # the share one decode step reads
        self.gated_activation = GATED_ACTIVATIONS[config.activation]
        self._caches: weakref.WeakSet[MlxKVCache] = weakref.WeakSet()
        mx.clear_cache()  # the load's chunk buffers
        platform_mlx.release_free_heap()
        self._previous_wired_limit = platform_mlx.wire_memory(weight_bytes)

    def _load_per_layer(self, reader: TensorReader) -> tuple[Matrix, Matrix, mx.array]:
        """gemma4's per-layer embeddings: the token rows (n_vocab, n_layers * n_embd_per_layer), the model
        projection (n_layers * n_embd_per_layer, n_embd) and its norm (n_embd_per_layer,)."""
        c = self.config
        width = c.n_layers * c.n_embd_per_layer
        for name, shape in (("per_layer_token_embd.weight", (width, c.n_vocab)),
                            ("per_layer_model_proj.weight", (c.n_embd, width)),
                            ("per_layer_proj_norm.weight", (c.n_embd_per_layer,))):
            if reader.gguf.tensor(name).shape != shape:
                raise ModelFormatError(f"tensor {name!r} has shape {reader.gguf.tensor(name).shape}, expected {shape}")
        return (load_matrix(reader, "per_layer_token_embd.weight"), load_matrix(reader, "per_layer_model_proj.weight"),
                load_vector(reader, "per_layer_proj_norm.weight"))

    def _load_layer(self, reader: TensorReader, i: int) -> LayerWeights:
        fields, fused = {}, {}  # fused: tensor name -> the whole matrix, loaded once for its row ranges
        for field, ref in layer_tensor_names(reader.gguf, self.config, i).items():
            if ref is None:
                fields[field] = None
            elif field in MATRIX_FIELDS:
                fields[field] = self._load_matrix(reader, ref, fused)
            else:
                dtype = self.dtype if field in MATMUL_SIDE_VECTORS else RESIDUAL_DTYPE
                vector = load_vector(reader, ref.name, dtype)
                fields[field] = vector if ref.is_whole else vector[ref.rows(vector.shape[0])]
        if self.config.is_recurrent(i):
            fields["deltanet"] = load_mlx_deltanet(reader, self.config, i)
        return LayerWeights(**fields)

    @staticmethod
    def _load_matrix(reader: TensorReader, ref: TensorRef, fused: dict[str, Matrix]) -> Matrix:
        """The matrix ``ref`` names, or its row range of a fused tensor (slices of the arrays: views)."""
        if ref.is_whole:
            return load_matrix(reader, ref.name)
        if ref.name not in fused:
            fused[ref.name] = load_matrix(reader, ref.name)
        return row_range(fused[ref.name], ref)

    def _rope_tables(self, gguf: GGUFFile, n_ctx: int | None) -> None:
        """``rope_periods``: per frequency set of ``rope.rope_tables``, the periods 1 / inv_freq
        (rope_dim // 2,) float32 that ``mx.fast.rope`` takes as ``freqs``; ``rope_layer_set``: each layer's
        set, -1 for a layer without RoPE."""
        inv_freq, self.rope_layer_set = rope_tables(gguf, self.config, n_ctx)  # (n_sets, rope_dim // 2)
        self.rope_periods = [mx.array((1.0 / row).astype(np.float32)) for row in inv_freq]

    # -- the contract ------------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> MlxKVCache:
        kind = MlxHybridCache if self.config.is_hybrid else MlxKVCache
        cache = kind(self.config, n_ctx, self._replay, self.dtype)
        self._caches.add(cache)
        return cache

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        outputs = []
        for hidden in self._chunks(self._checked(tokens), cache, last_only=not all_logits):  # (1, L, n_embd) each
            if all_logits:
                outputs.append(self.logits(hidden[0]))
        logits = mx.concatenate(outputs) if all_logits else self.logits(hidden[0, -1:])[0]
        return np.array(logits)

    def forward_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step for several sequences: the B rows share every weight read, attention is per cache."""
        ids = self._checked(tokens)
        if len(ids) != len(caches) or len({id(c) for c in caches}) != len(caches):
            raise ValueError(f"forward_batch needs one token per distinct cache, got {len(ids)} for {len(caches)}")
        for cache in caches:
            cache.reserve(1)
        x = self.embed(mx.array(ids))[:, None, :]  # (B, 1, n_embd)
        layer_inputs = self._per_layer_inputs(mx.array(ids)[:, None], x)
        starts = [cache.n_past for cache in caches]
        if self.config.is_hybrid:
            for cache in caches:
                cache.recurrent.begin_call(1)
        for i, layer in enumerate(self.layers):
            if layer.deltanet is not None:
                x = x + self._residual(self._deltanet(i, layer, x, caches))
                x = x + self._residual(self._ffn(layer, x))
                continue
            x = x + self._residual(self._attention_batch(i, layer, x, caches, starts))
            x = self._layer_output(i, layer, x + self._residual(self._ffn(layer, x)), layer_inputs)
        for cache, token in zip(caches, ids):
            cache.advance(1)
            cache.record([token])
        return np.array(self.logits(x[:, 0]))

    def decode_pipelined(self, tokens: Sequence[int], cache: MlxKVCache,
                         sample: Callable[[mx.array], mx.array]) -> Iterator[tuple[int, float]]:
        """Prefill ``tokens``, then yield ``(token, logprob)`` per step until the cache is full.

        ``sample`` maps logits (n_vocab,) to a token id on the device, so step k + 1 is built and queued
        (``mx.async_eval``) before token k is read back: the host and the device overlap. Each yielded token
        is already being fed back into ``cache`` when the caller sees it (``cache.n_past`` counts it).
        """
        for hidden in self._chunks(self._checked(tokens), cache, last_only=True):
            pass
        step = self._sampled(self.logits(hidden[0, -1:])[0], sample)
        while cache.n_past < cache.n_ctx:
            cache.reserve(1)
            following = self._sampled(self.logits(self._forward_chunk(step[0].reshape(1), cache)[0])[0], sample)
            token = step[0].item()
            cache.record([token])
            yield token, step[1].item()
            step = following
        yield step[0].item(), step[1].item()

    def decode_greedy_pipelined(self, token: int, cache: KVCache) -> Iterator[tuple[int, float]]:
        return self.decode_pipelined([token], cache, _device_argmax)

    def greedy_step(self, cache: MlxKVCache, new_tokens: Sequence[int], sample, history: list[int],
                    chunk_size: int = 512, cancel: threading.Event | None = None) -> Iterator[tuple[int, float]]:
        """``generate.generate_step`` for greedy decoding without penalties, with the argmax on the device and
        each step queued before the previous token is read back (``decode_pipelined``), as mlx-lm decodes.

        The prompt is prefilled in ``chunk_size`` chunks that ``cancel`` can stop between, as generate_step's;
        ``sample`` is not called: the log-probability is the log-softmax at the argmax, as the Sampler's greedy
        one. Each yielded token is already being fed back into ``cache``.
        """
        if len(new_tokens) > 1:
            prefill(self, cache, new_tokens[:-1], chunk_size, cancel)
        for token, logprob in self.decode_pipelined(new_tokens[-1:], cache, _device_argmax):
            history.append(token)
            yield token, logprob

    @staticmethod
    def _sampled(logits: mx.array, sample: Callable[[mx.array], mx.array]) -> tuple[mx.array, mx.array]:
        """The sampled token and its log-probability, queued for evaluation."""
        token = sample(logits)
        logprob = logits[token] - mx.logsumexp(logits)
        mx.async_eval(token, logprob)
        return token, logprob

    def memory(self) -> MemoryStats:
        weights = self.weights_nbytes()
        return MemoryStats(
            weights_bytes=weights,
            kv_cache_bytes=sum(cache.nbytes for cache in self._caches),
            active_weights_bytes=round(weights * self.active_weight_fraction),
            device_active_bytes=mx.get_active_memory(),
            device_peak_bytes=mx.get_peak_memory(),
            device_cache_bytes=mx.get_cache_memory(),
        )

    def weights_nbytes(self) -> int:
        total = sum(getattr(layer, f).nbytes for layer in self.layers for f in MATRIX_FIELDS
                    if getattr(layer, f) is not None)  # a model has either the dense FFN or the experts
        total += sum(v.nbytes for layer in self.layers for v in vars(layer).values() if isinstance(v, mx.array))
        total += sum(layer.deltanet.nbytes for layer in self.layers if layer.deltanet is not None)
        total += self.token_embd.nbytes + self.output_norm.nbytes
        return total + (self.output.nbytes if self.output is not self.token_embd else 0)

    def close(self) -> None:
        self.layers, self.token_embd, self.output = [], None, None
        mx.clear_cache()
        platform_mlx.restore_wired_limit(self._previous_wired_limit)
        self._previous_wired_limit = None

    # -- the decoder -------------------------------------------------------------------------------------
    def _checked(self, tokens: Sequence[int]) -> list[int]:
        ids = [int(t) for t in tokens]
        if not ids:
            raise ValueError("forward needs at least one token")
        if min(ids) < 0 or max(ids) >= self.config.n_vocab:
            raise ValueError(f"token id out of range 0..{self.config.n_vocab - 1}")
        return ids

    def _chunks(self, ids: list[int], cache: MlxKVCache, last_only: bool = False) -> Iterator[mx.array]:
        """Run ``ids`` through the decoder in chunks of MAX_CHUNK, yielding each chunk's hidden (1, L, n_embd).

        The cache is evaluated between chunks, so only one chunk's graph is ever pending. With ``last_only``,
        the last chunk yields the hidden state of its last position only (1, 1, n_embd).
        """
        cache.reserve(len(ids))
        for start in range(0, len(ids), MAX_CHUNK):
            if start:
                mx.eval(cache.arrays())
            chunk = ids[start:start + MAX_CHUNK]
            hidden = self._forward_chunk(mx.array(chunk), cache, last_only and start + MAX_CHUNK >= len(ids))
            cache.record(chunk)
            yield hidden

    def _replay(self, cache: MlxKVCache, tokens: Sequence[int]) -> None:
        """Recompute the keys and values of ``tokens`` into an emptied cache (no logits)."""
        for _ in self._chunks(list(tokens), cache):
            pass
        mx.eval(cache.arrays())

    def embed(self, ids: mx.array) -> mx.array:
        """Embedding rows of ``ids`` (n,), scaled as the architecture asks; (n, n_embd)."""
        rows = self.token_embd.rows(ids)
        return rows * self.config.embed_scale if self.config.embed_scale != 1.0 else rows

    def logits(self, hidden: mx.array) -> mx.array:
        """Final norm and output projection, scaled and soft-capped as the architecture asks:
        (n, n_embd) -> (n, n_vocab) float32."""
        c = self.config
        logits = self.output.matmul(self._norm(hidden, self.output_norm)).astype(RESIDUAL_DTYPE)
        if c.logit_scale != 1.0:
            logits = logits * c.logit_scale
        return softcap(logits, c.final_softcap) if c.final_softcap else logits

    def _norm(self, x: mx.array, weight: mx.array | None) -> mx.array:
        """RMS norm of the residual stream (none when ``weight`` is None), as a matrix-product input."""
        if weight is None:
            return x.astype(self.dtype)
        return mx.fast.rms_norm(x, weight, self.config.rms_eps).astype(self.dtype)

    def _forward_chunk(self, ids: mx.array, cache: MlxKVCache, last_only: bool = False) -> mx.array:
        """The decoder over ``ids`` (L,) at positions ``cache.n_past ...`` (room reserved); hidden (1, L, n_embd).

        With ``last_only`` the hidden state of the last position only, (1, 1, n_embd): the last layer stores
        every position's keys and values but runs its attention and FFN for that one query (as llama.cpp
        does), which no other position's output needs.
        """
        start, last = cache.n_past, len(self.layers) - 1
        x = self.embed(ids)[None]  # (1, L, n_embd)
        snapshot = cache.recurrent.begin_call(ids.size) if self.config.is_hybrid else False
        layer_inputs = self._per_layer_inputs(ids[None], x)
        for i, layer in enumerate(self.layers):
            if layer.deltanet is not None:  # every row feeds the recurrent state, even with last_only
                x = x + self._residual(self._deltanet(i, layer, x, [cache], snapshot))
                x = x[:, -1:] if last_only and i == last else x
            elif last_only and i == last and ids.size > 1:
                x = x[:, -1:] + self._residual(self._attention(i, layer, x, cache, start, last_query=True))
                layer_inputs = None if layer_inputs is None else layer_inputs[:, :, -1:]
            else:
                x = x + self._residual(self._attention(i, layer, x, cache, start))
            x = self._layer_output(i, layer, x + self._residual(self._ffn(layer, x)), layer_inputs)
        cache.advance(ids.size)
        return x

    def _deltanet(self, i: int, layer: LayerWeights, x: mx.array, caches: Sequence[MlxHybridCache],
                  snapshot: bool = False) -> mx.array:
        """A recurrent layer's mixer on ``x`` (B, L, n_embd), row ``b`` continuing ``caches[b]``'s state."""
        states = [cache.recurrent.live[i] for cache in caches]
        snapshots = [] if snapshot else None
        out, new_states = mlx_deltanet(self._norm(x, layer.attn_norm), layer.deltanet, states, self.config,
                                       self.dtype, snapshots)
        for cache, state in zip(caches, new_states):
            cache.recurrent.live[i] = state
        for t, state in snapshots or ():
            caches[0].recurrent.add_snapshot(caches[0].n_past + t + 1, i, state)
        return out

    def _per_layer_inputs(self, ids: mx.array, x: mx.array) -> mx.array | None:
        """gemma4's per-layer inputs (n_layers, B, L, n_embd_per_layer) float32 for ids (B, L) embedded as
        ``x`` (B, L, n_embd) (``engine.gemma4``); None without per-layer embeddings."""
        if self.per_layer is None:
            return None
        c = self.config
        token_rows, model_proj, proj_norm = self.per_layer
        b, n = ids.shape
        tok = token_rows.rows(ids.reshape(-1)).astype(RESIDUAL_DTYPE).reshape(b, n, c.n_layers, c.n_embd_per_layer)
        proj = model_proj.matmul(x.astype(self.dtype)).astype(RESIDUAL_DTYPE) * (1.0 / np.sqrt(c.n_embd))
        proj = mx.fast.rms_norm(proj.reshape(b, n, c.n_layers, c.n_embd_per_layer), proj_norm, c.rms_eps)
        mixed = (proj + tok * float(np.sqrt(c.n_embd_per_layer))) * float(1.0 / np.sqrt(2.0))
        return mixed.transpose(2, 0, 1, 3)

    def _layer_output(self, i: int, layer: LayerWeights, x: mx.array, layer_inputs: mx.array | None) -> mx.array:
        """A layer's residual after its FFN, plus gemma4's per-layer embedding block and output scale."""
        if layer_inputs is not None:
            gate = layer.ple_gate.matmul(x.astype(self.dtype)).astype(RESIDUAL_DTYPE)
            gate = 0.5 * gate * (1.0 + mx.tanh(GELU_COEF * (gate + 0.044715 * gate * gate * gate))) * layer_inputs[i]
            out = layer.ple_proj.matmul(gate.astype(self.dtype)).astype(RESIDUAL_DTYPE)
            x = x + mx.fast.rms_norm(out, layer.ple_norm, self.config.rms_eps)
        if layer.out_scale is not None:
            x = x * layer.out_scale[0]
        return x

    def _residual(self, out: mx.array) -> mx.array:
        """A block's output as it joins the residual stream: scaled by ``residual_scale`` (Granite)."""
        scale = self.config.residual_scale
        return out if scale == 1.0 else out.astype(RESIDUAL_DTYPE) * scale

    def _qkv(self, i: int, layer: LayerWeights, x: mx.array, offset: int | list[int],
             last_query: bool = False) -> tuple[mx.array, mx.array, mx.array, mx.array | None]:
        """Normed, biased, rotated queries (B, n_heads, L, head_dim), keys and values (B, n_kv_heads, L, dim),
        and the output gate (B, L, n_heads * head_dim) of gated attention (qwen35), else None.

        ``offset`` is the position of the first row of ``x``: one int, or one per batch row (L = 1). With
        ``last_query``, the query of the last position only (B, n_heads, 1, head_dim).
        """
        c = self.config
        b, n, _ = x.shape
        h = self._norm(x, layer.attn_norm)
        q = layer.wq.matmul(h[:, -1:] if last_query else h)
        if layer.wk is None:  # gemma4: a layer that reads an earlier layer's cache
            q = q.reshape(b, q.shape[1], c.n_heads, c.layer_head_dim(i)).transpose(0, 2, 1, 3)
            q = mx.fast.rms_norm(q, layer.q_norm, c.rms_eps)
            return self._rope(i, q, offset + n - 1 if last_query else offset), None, None, None
        k = layer.wk.matmul(h)
        v = k if layer.wv is None else layer.wv.matmul(h)  # gemma4: no attn_v, the keys are the values
        if layer.bq is not None:
            q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
        gate = None
        if c.attn_output_gate:  # per head: the query, then its gate
            both = q.reshape(b, q.shape[1], c.n_heads, 2, c.head_dim)
            q, gate = both[..., 0, :].reshape(b, -1, c.n_q_embd), both[..., 1, :].reshape(b, -1, c.n_q_embd)
        if c.qk_norm_whole:  # OLMo 2: over the whole projection, before the split into heads
            q, k = mx.fast.rms_norm(q, layer.q_norm, c.rms_eps), mx.fast.rms_norm(k, layer.k_norm, c.rms_eps)
        q = q.reshape(b, q.shape[1], c.n_heads, c.layer_head_dim(i)).transpose(0, 2, 1, 3)
        k = k.reshape(b, n, c.layer_n_kv_heads(i), c.layer_head_dim(i)).transpose(0, 2, 1, 3)
        v = v.reshape(b, n, c.layer_n_kv_heads(i), c.layer_v_head_dim(i)).transpose(0, 2, 1, 3)
        if layer.q_norm is not None and not c.qk_norm_whole:
            q = mx.fast.rms_norm(q, layer.q_norm, c.rms_eps)
            k = mx.fast.rms_norm(k, layer.k_norm, c.rms_eps)
        if c.v_norm:
            v = mx.fast.rms_norm(v, None, c.rms_eps)
        q_offset = offset + n - 1 if last_query else offset
        q, k = self._rope(i, q, q_offset), self._rope(i, k, offset)
        if c.attn_temp_scale:
            q = q * self._temperature(q_offset, q.shape[2])
        return q, k, v, gate

    def _rope(self, i: int, x: mx.array, offset: int | list[int]) -> mx.array:
        """Rotate the first ``rope_dim`` dims of ``x`` (B, heads, L, dim) with layer ``i``'s frequency set,
        scaled by ``rope_mscale``; layers without RoPE (SmolLM3) pass ``x`` through."""
        c = self.config
        which = self.rope_layer_set[i]
        if which < 0:
            return x
        offset = mx.array(offset) if isinstance(offset, list) else offset
        rope_dim = c.layer_rope_dim(i)
        x = mx.fast.rope(x, rope_dim, traditional=not c.rope_neox, base=None, scale=1.0, offset=offset,
                         freqs=self.rope_periods[which])
        if c.rope_mscale == 1.0:
            return x
        if rope_dim == x.shape[-1]:
            return x * c.rope_mscale  # mscale multiplies cos and sin alike
        # partial rotary (phi3): ggml copies the dims past rope_dim unscaled
        return mx.concatenate([x[..., :rope_dim] * c.rope_mscale, x[..., rope_dim:]], axis=-1)

    def _temperature(self, offset: int | list[int], n: int) -> mx.array:
        """Query multipliers of attention temperature tuning (``rope.attn_temperature``): (1, 1, n, 1) for
        positions ``offset ..``, or (B, 1, 1, 1) for one position per batch row."""
        if isinstance(offset, list):
            return mx.array(attn_temperature(self.config, np.array(offset))).reshape(-1, 1, 1, 1).astype(self.dtype)
        factors = attn_temperature(self.config, np.arange(offset, offset + n))
        return mx.array(factors).reshape(1, 1, n, 1).astype(self.dtype)

    def _attend(self, q: mx.array, keys: mx.array, values: mx.array, mask, sinks: mx.array | None = None) -> mx.array:
        """Attention of queries (1, n_heads, L, head_dim) over a cache view, with per-head sink logits where the
        model has them (gpt-oss); the explicit path only with soft-capped scores, which MLX's fused kernel does
        not do."""
        c = self.config
        if c.attn_softcap:
            return softcapped_attention(q, keys, values, c.attn_scale, c.attn_softcap, mask)
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=c.attn_scale, mask=mask, sinks=sinks)

    def _attention(self, i: int, layer: LayerWeights, x: mx.array, cache: MlxKVCache, start: int,
                   last_query: bool = False) -> mx.array:
        """Store the keys and values of every position of ``x``; with ``last_query``, output the last one's only."""
        q, k, v, gate = self._qkv(i, layer, x, start, last_query)
        kv, end = cache.layers[self.config.kv_layer(i)], start + x.shape[1]
        if k is not None:
            kv.store(k, v, start)
        keys, values = kv.view(end)
        first = end - q.shape[2]  # the position of the first query
        return self._attention_output(layer, self._attend(q, keys, values, kv.mask(first, end - first),
                                                          layer.attn_sinks), gate)

    def _attention_batch(self, i: int, layer: LayerWeights, x: mx.array, caches: Sequence[MlxKVCache],
                         starts: list[int]) -> mx.array:
        q, k, v, gate = self._qkv(i, layer, x, starts)
        outs = []
        for b, (cache, start) in enumerate(zip(caches, starts)):
            kv = cache.layers[self.config.kv_layer(i)]
            if k is not None:
                kv.store(k[b:b + 1], v[b:b + 1], start)
            keys, values = kv.view(start + 1)
            outs.append(self._attend(q[b:b + 1], keys, values, kv.mask(start, 1), layer.attn_sinks))
        return self._attention_output(layer, mx.concatenate(outs), gate)

    def _attention_output(self, layer: LayerWeights, out: mx.array, gate: mx.array | None = None) -> mx.array:
        """Attention heads (B, n_heads, L, v_head_dim) -> the block's output (B, L, n_embd), gated by
        ``sigmoid(gate)`` first where the architecture has an output gate."""
        b, _, n, _ = out.shape
        out = out.transpose(0, 2, 1, 3).reshape(b, n, -1)
        if gate is not None:
            out = out * mx.sigmoid(gate)
        out = layer.wo.matmul(out)
        if layer.bo is not None:
            out = out + layer.bo
        if layer.post_attn_norm is not None:
            out = mx.fast.rms_norm(out, layer.post_attn_norm, self.config.rms_eps)
        return out

    def _ffn(self, layer: LayerWeights, x: mx.array) -> mx.array:
        if self.config.ffn_dense_and_experts:
            return mx.fast.rms_norm(self._dense_and_experts(layer, x), layer.post_ffn_norm, self.config.rms_eps)
        h = self._norm(x, layer.ffn_norm)
        if self.config.is_moe:
            out = self._moe(layer, h)
        else:
            out = layer.w_down.matmul(self.gated_activation(layer.w_gate.matmul(h), layer.w_up.matmul(h)))
        if layer.post_ffn_norm is not None:
            out = mx.fast.rms_norm(out, layer.post_ffn_norm, self.config.rms_eps)
        return out

    def _dense_and_experts(self, layer: LayerWeights, x: mx.array) -> mx.array:
        """gemma4's FFN with experts (``engine.gemma4.dense_and_experts_ffn``), before ``post_ffw_norm``."""
        c = self.config
        h = self._norm(x, layer.ffn_norm)
        dense = layer.w_down.matmul(self.gated_activation(layer.w_gate.matmul(h), layer.w_up.matmul(h)))
        router_in = mx.fast.rms_norm(x, None, c.rms_eps) * (1.0 / np.sqrt(c.n_embd)) * layer.router_scale
        logits = layer.w_router.matmul(router_in.astype(self.dtype))
        scale = None if layer.down_exps_scale is None else np.array(layer.down_exps_scale.astype(mx.float32))
        experts = moe_ffn(self._norm(x, layer.pre_ffn_norm_2), layer, c, self.gated_activation, row_range, self.dtype,
                          logits=logits, down_scale=scale)
        return (mx.fast.rms_norm(dense.astype(RESIDUAL_DTYPE), layer.post_ffn_norm_1, c.rms_eps)
                + mx.fast.rms_norm(experts, layer.post_ffn_norm_2, c.rms_eps))

    def _moe(self, layer: LayerWeights, h: mx.array) -> mx.array:
        """The mixture-of-experts FFN of normed rows h (..., n_embd) (``engine/backends/mlx/moe.py``)."""
        return moe_ffn(h, layer, self.config, self.gated_activation, row_range, self.dtype)


def row_range(matrix: Matrix, ref: TensorRef) -> Matrix:
    """Rows ``ref.row_start:ref.row_stop`` of ``matrix``: each of its arrays (rows first) sliced, a view (a
    PairMatrix's term arrays, two rows per row, at twice the range)."""
    arrays = {f.name: getattr(matrix, f.name) for f in dataclasses.fields(matrix)
              if isinstance(getattr(matrix, f.name), mx.array)}
    n_rows = min(array.shape[0] for array in arrays.values())  # a PairMatrix's terms have two rows per row
    rows = ref.rows(n_rows)
    terms = slice(2 * rows.start, 2 * rows.stop)
    return dataclasses.replace(matrix, **{name: array[terms if array.shape[0] == 2 * n_rows else rows]
                                          for name, array in arrays.items()})


def softcap(x: mx.array, cap: float) -> mx.array:
    """``cap * tanh(x / cap)``: values squashed smoothly into (-cap, cap) (Gemma 2's scores and logits)."""
    return cap * mx.tanh(x / cap)


def softcapped_attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, cap: float,
                         mask: mx.array | str | None) -> mx.array:
    """Grouped-query attention with soft-capped scores, in float32.

    Args:
        q: queries (1, n_heads, L, head_dim); the last L of the S key positions.
        keys: (1, n_kv_heads, S, head_dim); values (1, n_kv_heads, S, v_head_dim).
        mask: as ``LayerKV.mask`` gives it: None (all), "causal", or bool (L, S), True where allowed.

    Returns:
        (1, n_heads, L, v_head_dim) in the dtype of ``q``.
    """
    b, n_heads, n, head_dim = q.shape
    n_kv, s = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    qg = q.astype(mx.float32).reshape(b, n_kv, group * n, head_dim) * scale  # heads of one kv head together
    scores = softcap(qg @ keys.astype(mx.float32).swapaxes(-1, -2), cap).reshape(b, n_kv, group, n, s)
    if isinstance(mask, str):
        mask = mx.arange(s)[None, :] <= mx.arange(s - n, s)[:, None]  # (L, S)
    if mask is not None:
        scores = mx.where(mask, scores, float("-inf"))
    probs = mx.softmax(scores, axis=-1).reshape(b, n_kv, group * n, s)
    return (probs @ values.astype(mx.float32)).reshape(b, n_heads, n, -1).astype(q.dtype)
