"""Gemma 4's blocks beyond gemma3, as llama.cpp defines them (src/models/gemma4.cpp): the config fields, and the
per-layer embeddings and the FFN with experts in NumPy (MLX's are in mlx_backend).

What is new against gemma3 (everything else, the post-norms, GELU FFN, q/k norms, sliding layers with their own
RoPE base and the final soft-capping, is gemma3's):

- sliding and full layers have different head widths (``attention.key_length_swa``) and RoPE dimensions
  (``rope.dimension_count_swa``); the ``rope_freqs`` tensor divides the full layers' frequencies only;
- the attention scale is 1 (the q/k norms do the scaling); values are RMS-normed without a weight, and a layer
  without ``attn_v`` uses its keys (before their norm) as values;
- the last ``attention.shared_kv_layers`` layers compute no keys or values: each attends over the cache of the
  last earlier layer of its kind;
- per-layer embeddings (``embedding_length_per_layer_input``): a second token embedding of
  ``n_layers * n_embd_per_layer`` per token, mixed with a projection of the scaled input embedding, gives every
  layer an input that gates a small projection added to the residual after the FFN;
- an optional scalar ``layer_output_scale`` multiplies each layer's output.

Per-layer ``attention.head_count_kv`` and ``feed_forward_length`` arrays are read as one value per layer kind
(full / sliding KV heads, ordinary / shared-KV FFN width), the variations the converter writes.

With ``expert_count`` (the 26B-A4B model) every layer's FFN is the dense FFN and a softmax-routed mixture side by
side, each with its own norms, routed from ``rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale``, each expert's
output times ``ffn_down_exps.scale`` where the file has it.

Not implemented (refused with a message naming them): a fused ``attn_qkv``, fused ``ffn_gate_up_exps``, and a
model whose layers mix expert and dense-only FFNs (llama.cpp decides per layer by ``ffn_gate_inp``).
"""

from __future__ import annotations

import numpy as np

from .gguf_file import GGUFFile, ModelFormatError

# per-layer tensors only gemma4 has: Layer field -> (tensor suffix, required)
GEMMA4_LAYER_TENSORS = {
    "out_scale": ("layer_output_scale.weight", False),  # (1,)
    "ple_gate": ("inp_gate.weight", True),  # (n_embd_per_layer, n_embd) numpy order
    "ple_proj": ("proj.weight", True),  # (n_embd, n_embd_per_layer)
    "ple_norm": ("post_norm.weight", True),  # (n_embd,)
    # the 26B-A4B model's FFN with experts (ModelConfig.ffn_dense_and_experts)
    "router_scale": ("ffn_gate_inp.scale", True),  # (n_embd,)
    "pre_ffn_norm_2": ("pre_ffw_norm_2.weight", True),
    "post_ffn_norm_1": ("post_ffw_norm_1.weight", True),
    "post_ffn_norm_2": ("post_ffw_norm_2.weight", True),
    "down_exps_scale": ("ffn_down_exps.scale", False),  # (n_expert,) each expert's output multiplier
}
GEMMA4_GLOBAL_TENSORS = ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight")


def gemma4_fields(gguf: GGUFFile, arch: str, fields: dict, gemma: dict) -> dict:
    """The ModelConfig fields of a gemma4 file beyond the gemma ones in ``gemma`` (llama.cpp's
    ``llama_model_gemma4::load_arch_hparams`` and the generic SWA head-size keys)."""
    n_layers = fields["n_layers"]
    if any(name.endswith("attn_qkv.weight") for name in gguf.tensors):
        raise ModelFormatError("gemma4 with a fused attn_qkv tensor is not supported by this engine")
    if gemma["sliding_window"] <= 0:
        raise ModelFormatError(f"metadata {arch}.attention.sliding_window is required for gemma4")
    if fields["v_head_dim"] != fields["head_dim"]:
        raise ModelFormatError("gemma4 requires attention.key_length == attention.value_length")
    head_dim_swa = gguf.get(f"{arch}.attention.key_length_swa", int, fields["head_dim"])
    if gguf.get(f"{arch}.attention.value_length_swa", int, fields["v_head_dim"]) != head_dim_swa:
        raise ModelFormatError("gemma4 requires attention.key_length_swa == attention.value_length_swa")
    if not 0 < head_dim_swa <= 1 << 14:
        raise ModelFormatError(f"metadata {arch}.attention.key_length_swa = {head_dim_swa} is out of range")
    rope_dim_swa = gguf.get(f"{arch}.rope.dimension_count_swa", int, fields["rope_dim"])
    if not 0 < rope_dim_swa <= head_dim_swa or rope_dim_swa % 2:
        raise ModelFormatError(f"metadata {arch}.rope.dimension_count_swa = {rope_dim_swa} is out of range")
    shared = gguf.get(f"{arch}.attention.shared_kv_layers", int, 0)
    if shared and not 0 <= shared <= n_layers - 2:
        raise ModelFormatError(f"metadata {arch}.attention.shared_kv_layers = {shared} is out of range")
    n_embd_per_layer = gguf.get(f"{arch}.embedding_length_per_layer_input", int)  # required by llama.cpp
    if not 0 <= n_embd_per_layer <= 1 << 16:
        raise ModelFormatError(f"metadata {arch}.embedding_length_per_layer_input = {n_embd_per_layer} is out of range")
    out = dict(attn_scale=1.0, qk_norm=True, v_norm=True, head_dim_swa=head_dim_swa, rope_dim_swa=rope_dim_swa,
               n_kv_shared_layers=shared, n_embd_per_layer=n_embd_per_layer)
    if shared:
        _check_shared_layers(gemma["swa_pattern"], gemma["sliding_window"], n_layers, shared)
    out.update(_by_layer_kind(layer_arrays(gguf, arch), fields, gemma, shared))
    if gguf.get(f"{arch}.expert_count", int, 0):
        out.update(_experts(gguf, arch))
    return out


def _experts(gguf: GGUFFile, arch: str) -> dict:
    """The 26B-A4B model's mixture: softmax routing, renormalised top-k weights, beside the dense FFN."""
    n_expert = gguf.get(f"{arch}.expert_count", int)
    used = gguf.get(f"{arch}.expert_used_count", int)
    n_ff_exp = gguf.get(f"{arch}.expert_feed_forward_length", int)
    if not 0 < used <= n_expert <= 1 << 12 or not 0 < n_ff_exp <= 1 << 20:
        raise ModelFormatError(f"metadata {arch}.expert_count / expert_used_count / expert_feed_forward_length "
                               f"= {n_expert} / {used} / {n_ff_exp} are out of range")
    return dict(n_expert=n_expert, n_expert_used=used, n_ff_exp=n_ff_exp, expert_gating="softmax",
                expert_norm_weights=True, ffn_dense_and_experts=True)


def dense_and_experts_ffn(x: np.ndarray, layer, config, matmul, matrix_rows, gated, rms_norm, moe_ffn) -> np.ndarray:
    """gemma4's FFN with experts (NumPy and C products): the dense FFN on ``ffn_norm(x)`` and the experts on
    ``pre_ffw_norm_2(x)``, routed by ``rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale``, each post-normed, summed.
    ``x`` (n, n_embd) is the residual after attention; returns (n, n_embd) before ``post_ffw_norm``."""
    c = config
    h = np.ascontiguousarray(rms_norm(x, layer.ffn_norm, c.rms_eps), dtype=np.float32)
    dense = matmul(np.ascontiguousarray(gated(matmul(h, layer.w_gate), matmul(h, layer.w_up)), dtype=np.float32),
                   layer.w_down)
    router_in = rms_norm(x, np.float32(1.0), c.rms_eps) * np.float32(1.0 / np.sqrt(c.n_embd)) * layer.router_scale
    logits = matmul(np.ascontiguousarray(router_in, dtype=np.float32), layer.w_router)
    h2 = np.ascontiguousarray(rms_norm(x, layer.pre_ffn_norm_2, c.rms_eps), dtype=np.float32)
    experts = moe_ffn(h2, layer, c, matmul, matrix_rows, gated, logits=logits, down_scale=layer.down_exps_scale)
    return rms_norm(dense, layer.post_ffn_norm_1, c.rms_eps) + rms_norm(experts, layer.post_ffn_norm_2, c.rms_eps)


def layer_arrays(gguf: GGUFFile, arch: str) -> dict[str, list[int]]:
    """``attention.head_count_kv`` and ``feed_forward_length`` where the file gives one value per layer (the
    converter writes KV heads by layer kind for the 31B model and a double-wide FFN for E2B's shared layers)."""
    out = {}
    for key in ("attention.head_count_kv", "feed_forward_length"):
        value = gguf.metadata.get(f"{arch}.{key}")
        if value is None or isinstance(value, int):
            continue
        values = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else np.zeros(0)
        if values.ndim != 1 or not len(values) or values.dtype.kind not in "iu" \
                or not ((values > 0) & (values <= 1 << 20)).all():
            raise ModelFormatError(f"metadata {arch}.{key} must be a positive integer or one per layer")
        out[key] = [int(v) for v in values]
    return out


def _by_layer_kind(arrays: dict[str, list[int]], fields: dict, gemma: dict, shared: int) -> dict:
    """The per-layer arrays as the fields the decoders read: KV heads of the full and of the sliding layers, FFN
    width of the ordinary and of the shared-KV layers. Any other per-layer variation is refused."""
    n_layers, out = fields["n_layers"], {}
    window, pattern = gemma["sliding_window"], gemma["swa_pattern"]
    sliding = [window > 0 and pattern > 0 and il % pattern < pattern - 1 for il in range(n_layers)]
    if "attention.head_count_kv" in arrays:
        kv = arrays["attention.head_count_kv"]
        full = [kv[il] for il in range(min(n_layers, len(kv))) if not sliding[il]]
        swa = [kv[il] for il in range(min(n_layers, len(kv))) if sliding[il]]
        if len(kv) != n_layers or len(set(full)) > 1 or len(set(swa)) > 1 \
                or any(fields["n_heads"] % h for h in kv):
            raise ModelFormatError("metadata gemma4.attention.head_count_kv must give one value for the full and one "
                                   "for the sliding layers, each dividing head_count")
        out["n_kv_heads"] = full[0] if full else swa[0]
        out["n_kv_heads_swa"] = swa[0] if swa else 0
    if "feed_forward_length" in arrays:
        ff, n_kv = arrays["feed_forward_length"], n_layers - shared
        if len(ff) != n_layers or len(set(ff[:n_kv])) > 1 or len(set(ff[n_kv:])) > 1:
            raise ModelFormatError("metadata gemma4.feed_forward_length must give one value for the layers with "
                                   "their own KV and one for the shared-KV layers")
        out["n_ff"] = ff[0]
        out["n_ff_shared"] = ff[-1] if shared else 0
    return out


def _check_shared_layers(swa_pattern: int, window: int, n_layers: int, shared: int) -> None:
    """llama.cpp reuses layer n_kv - 2 for shared sliding layers and n_kv - 1 for full ones: they must be of
    those kinds."""
    def sliding(il: int) -> bool:
        return window > 0 and swa_pattern > 0 and il % swa_pattern < swa_pattern - 1

    n_kv = n_layers - shared
    if n_kv < 2 or sliding(n_kv - 1) or not sliding(n_kv - 2):
        raise ModelFormatError(f"gemma4 shared_kv_layers = {shared}: layer {n_kv - 1} must be a full-attention "
                               f"layer and layer {n_kv - 2} a sliding one, whose caches the shared layers read")


def uses_gemma4_blocks(config) -> bool:
    """Whether ``config`` asks for any block of this module (decoders that lack them must refuse the model)."""
    return bool(config.head_dim_swa or config.rope_dim_swa or config.v_norm or config.n_kv_shared_layers
                or config.n_embd_per_layer)


class PerLayerEmbeddings:
    """Gemma 4's per-layer inputs (llama.cpp ``build_inp_per_layer`` + ``project_per_layer_inputs``) and the
    block that adds them to each layer's output.

    Args:
        token_rows: the packed ``per_layer_token_embd`` rows and their dequantizer ``rows(ids) -> float32``.
        model_proj: ``per_layer_model_proj`` in the backend's matmul form, (n_layers * n_embd_per_layer, n_embd).
        proj_norm: ``per_layer_proj_norm`` (n_embd_per_layer,).
    """

    def __init__(self, token_rows, model_proj, proj_norm: np.ndarray, n_layers: int, n_embd: int,
                 n_embd_per_layer: int, eps: float):
        self.token_rows, self.model_proj, self.proj_norm = token_rows, model_proj, proj_norm
        self.n_layers, self.n_embd, self.width, self.eps = n_layers, n_embd, n_embd_per_layer, eps

    def inputs(self, tokens: np.ndarray, x: np.ndarray, matmul, rms_norm) -> np.ndarray:
        """Every layer's input for ``tokens`` whose scaled embeddings are ``x`` (n, n_embd):
        (n_layers, n, n_embd_per_layer) float32."""
        n = tokens.size
        tok = self.token_rows(tokens).reshape(n, self.n_layers, self.width) * np.float32(np.sqrt(self.width))
        proj = matmul(np.ascontiguousarray(x, dtype=np.float32), self.model_proj)
        proj = proj.reshape(n, self.n_layers, self.width) * np.float32(1.0 / np.sqrt(self.n_embd))
        proj = rms_norm(proj, self.proj_norm, self.eps)
        mixed = (proj + tok) * np.float32(1.0 / np.sqrt(2.0))
        return np.ascontiguousarray(mixed.transpose(1, 0, 2), dtype=np.float32)

    @staticmethod
    def block(x: np.ndarray, layer_input: np.ndarray, layer, matmul, gelu, rms_norm, eps: float) -> np.ndarray:
        """The per-layer embedding's addition to the residual ``x`` (n, n_embd) for one layer's input."""
        gate = gelu(matmul(np.ascontiguousarray(x, dtype=np.float32), layer.ple_gate)) * layer_input
        out = matmul(np.ascontiguousarray(gate, dtype=np.float32), layer.ple_proj)
        return rms_norm(out, layer.ple_norm, eps)
