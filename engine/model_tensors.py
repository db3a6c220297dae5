"""Where each decoder weight lives in a GGUF file, per layer, for every supported architecture.

A field maps to a ``TensorRef``: a tensor and a range of its rows (of its elements, for a vector). Plain
tensors are referenced whole; fused ones are row ranges of one tensor: phi3's ``attn_qkv`` holds q, k and
v (in that order, llama.cpp ``build_qkv``) and its ``ffn_up`` the gate then the up projection (ggml's
``swiglu`` takes the first half as the gate). Each backend's matrix loader takes the row range (row slices
of a packed matrix are views, no copy).
"""

from __future__ import annotations

import dataclasses

from .config import ModelConfig
from .deltanet import DELTANET_TENSORS, deltanet_tensor_names
from .gemma4 import GEMMA4_GLOBAL_TENSORS, GEMMA4_LAYER_TENSORS
from .gguf_file import GGUFFile, ModelFormatError

# field -> (tensor suffix, required)
LAYER_TENSORS = {
    "attn_norm": ("attn_norm.weight", True),
    "wq": ("attn_q.weight", True),
    "wk": ("attn_k.weight", True),
    "wv": ("attn_v.weight", True),
    "wo": ("attn_output.weight", True),
    "bq": ("attn_q.bias", False),
    "bk": ("attn_k.bias", False),
    "bv": ("attn_v.bias", False),
    "q_norm": ("attn_q_norm.weight", False),
    "k_norm": ("attn_k_norm.weight", False),
    "post_attn_norm": ("post_attention_norm.weight", False),
    "ffn_norm": ("ffn_norm.weight", True),
    "w_gate": ("ffn_gate.weight", True),
    "w_up": ("ffn_up.weight", True),
    "w_down": ("ffn_down.weight", True),
    "post_ffn_norm": ("post_ffw_norm.weight", False),
    # mixture of experts: the router, and every expert's matrices stacked in one 3-D tensor each
    "w_router": ("ffn_gate_inp.weight", False),
    "w_gate_exps": ("ffn_gate_exps.weight", False),
    "w_up_exps": ("ffn_up_exps.weight", False),
    "w_down_exps": ("ffn_down_exps.weight", False),
    # parts of the blocks only some architectures have (CONDITIONAL_FIELDS says which)
    "bo": ("attn_output.bias", False),
    "attn_sinks": ("attn_sinks.weight", False),
    "b_router": ("ffn_gate_inp.bias", False),
    "b_gate_exps": ("ffn_gate_exps.bias", False),  # (n_expert, n_ff_exp) numpy order
    "b_up_exps": ("ffn_up_exps.bias", False),
    "b_down_exps": ("ffn_down_exps.bias", False),  # (n_expert, n_embd)
    "exp_probs_b": ("exp_probs_b.bias", False),
    "w_gate_shexp": ("ffn_gate_shexp.weight", False),
    "w_up_shexp": ("ffn_up_shexp.weight", False),
    "w_down_shexp": ("ffn_down_shexp.weight", False),
    "w_gate_inp_shexp": ("ffn_gate_inp_shexp.weight", False),  # (n_embd,): the shared expert's sigmoid gate
    **GEMMA4_LAYER_TENSORS,
}
MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "w_router", "w_gate_exps", "w_up_exps",
                 "w_down_exps", "w_gate_shexp", "w_up_shexp", "w_down_shexp", "ple_gate", "ple_proj")
ATTENTION_FIELDS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "q_norm", "k_norm")  # absent in a recurrent layer
DENSE_FFN_FIELDS = ("w_gate", "w_up", "w_down")
EXPERT_FIELDS = ("w_router", "w_gate_exps", "w_up_exps", "w_down_exps")
# fields a model has exactly when its config says so: required then, and refused as unknown otherwise
CONDITIONAL_FIELDS = {
    "bo": lambda c: c.attn_out_bias,
    "attn_sinks": lambda c: c.attn_sinks,
    "b_router": lambda c: c.moe_biases,
    "b_gate_exps": lambda c: c.moe_biases,
    "b_up_exps": lambda c: c.moe_biases,
    "b_down_exps": lambda c: c.moe_biases,
    "exp_probs_b": lambda c: c.expert_selection_bias,
    "w_gate_shexp": lambda c: c.n_ff_shexp > 0,
    "w_up_shexp": lambda c: c.n_ff_shexp > 0,
    "w_down_shexp": lambda c: c.n_ff_shexp > 0,
    "w_gate_inp_shexp": lambda c: c.shexp_gate,
    "ple_gate": lambda c: c.n_embd_per_layer > 0,
    "ple_proj": lambda c: c.n_embd_per_layer > 0,
    "ple_norm": lambda c: c.n_embd_per_layer > 0,
    "router_scale": lambda c: c.ffn_dense_and_experts,
    "pre_ffn_norm_2": lambda c: c.ffn_dense_and_experts,
    "post_ffn_norm_1": lambda c: c.ffn_dense_and_experts,
    "post_ffn_norm_2": lambda c: c.ffn_dense_and_experts,
}
ARCH_ONLY_FIELDS = {"out_scale": "gemma4", "down_exps_scale": "gemma4"}  # optional fields only one architecture reads
KV_FIELDS = ("wk", "wv", "bk", "bv", "k_norm")  # absent (ignored) in a layer that reads another layer's cache
# per architecture, fields stored under another tensor name (None: the field is absent). gpt-oss's
# "post_attention_norm" is the norm before its FFN (llama.cpp's attn_post_norm, applied to the residual)
_PRE_FFN_NORM_AS_POST_ATTENTION = {"ffn_norm": "post_attention_norm.weight", "post_attn_norm": None}
RENAMED_FIELDS = {arch: _PRE_FFN_NORM_AS_POST_ATTENTION for arch in ("gpt-oss", "qwen35", "qwen35moe")}
# tensors outside the layers that a model may hold, besides token_embd / output_norm / output
GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight",
                  "rope_factors_long.weight", "rope_factors_short.weight")


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """Rows ``row_start:row_stop`` of tensor ``name`` (elements, for a vector); ``row_stop`` None = all."""

    name: str
    row_start: int = 0
    row_stop: int | None = None

    @property
    def is_whole(self) -> bool:
        return self.row_start == 0 and self.row_stop is None

    def rows(self, n_rows: int) -> slice:
        """The row slice within a tensor of ``n_rows`` rows."""
        return slice(self.row_start, n_rows if self.row_stop is None else self.row_stop)


def layer_tensor_names(gguf: GGUFFile, config: ModelConfig, layer: int) -> dict[str, TensorRef | None]:
    """Tensor references of one layer by field; optional tensors the model lacks map to None.

    For layer 0 it also checks the whole file's tensor list: a tensor llama.cpp would accept for this
    architecture but this engine does not implement (an output bias, FFN biases, MoE experts ...) raises
    ModelFormatError naming it, rather than being ignored into wrong output.

    Raises ModelFormatError when a tensor the architecture needs is missing or has the wrong shape.
    """
    if layer == 0:
        _check_no_unknown_tensors(gguf, config)
    c = config
    prefix = f"blk.{layer}."
    refs: dict[str, TensorRef | None] = {}
    recurrent = c.is_recurrent(layer)  # a Gated DeltaNet layer: engine.deltanet loads its mixer
    fused_qkv = prefix + "attn_qkv.weight" in gguf.tensors and not recurrent
    fused_up = c.arch == "phi3"  # llama.cpp phi3: ffn_up is (n_embd, 2 * n_ff), gate first
    renamed = RENAMED_FIELDS.get(c.arch, {})
    for field, (suffix, required) in LAYER_TENSORS.items():
        if (field in renamed and renamed[field] is None) or (recurrent and field in ATTENTION_FIELDS) \
                or (field in KV_FIELDS and c.kv_layer(layer) != layer):
            refs[field] = None
            continue
        name = prefix + renamed.get(field, suffix)
        if fused_qkv and field in ("wq", "wk", "wv", "bq", "bk", "bv"):
            refs[field] = _qkv_part(gguf, c, prefix, field)
            continue
        if fused_up and field in ("w_gate", "w_up"):
            name = prefix + "ffn_up.weight"
            refs[field] = TensorRef(name, 0, c.n_ff) if field == "w_gate" else TensorRef(name, c.n_ff, 2 * c.n_ff)
            if name not in gguf.tensors:
                raise ModelFormatError(f"the model has no tensor {name!r}, which {c.arch} needs")
            continue
        needed = _needed(c, field, required)
        if name not in gguf.tensors:
            if needed and field in ("wq", "wk", "wv"):
                raise ModelFormatError(f"the model has no tensor {name!r} nor a fused {prefix + 'attn_qkv.weight'!r}, "
                                       f"which {c.arch} needs")
            if needed:
                raise ModelFormatError(f"the model has no tensor {name!r}, which {c.arch} needs")
            refs[field] = None
        elif field in ("attn_norm", "ffn_norm") and not c.pre_norms:
            raise ModelFormatError(f"tensor {name!r} is not used by {c.arch}, which has no pre-norms")
        else:
            refs[field] = TensorRef(name)
    if recurrent:  # checked here too, so a verdict from the header alone sees what loading would
        deltanet_tensor_names(gguf, c, layer)
    _check_shapes(gguf, c, refs, layer)
    return refs


def _needed(c: ModelConfig, field: str, required: bool) -> bool:
    if field in CONDITIONAL_FIELDS:
        return CONDITIONAL_FIELDS[field](c)
    if field in ("attn_norm", "ffn_norm"):
        return c.pre_norms
    if field == "wv" and c.v_norm:  # gemma4: a layer without attn_v uses its keys as values
        return False
    if field in DENSE_FFN_FIELDS:
        return not c.is_moe or c.ffn_dense_and_experts
    if field in EXPERT_FIELDS:
        return c.is_moe
    return required or (field in ("bq", "bk", "bv") and c.qkv_bias) \
        or (field in ("q_norm", "k_norm") and (c.qk_norm or c.qk_norm_whole)) \
        or (field in ("post_attn_norm", "post_ffn_norm") and c.post_norms)


def _qkv_part(gguf: GGUFFile, c: ModelConfig, prefix: str, field: str) -> TensorRef | None:
    """q, k or v rows of the fused ``attn_qkv`` weight (or bias): q first, then k, then v."""
    n_q, n_k, n_v = c.n_q_embd, c.n_kv_embd, c.n_kv_heads * c.v_head_dim
    start, stop = {"q": (0, n_q), "k": (n_q, n_q + n_k), "v": (n_q + n_k, n_q + n_k + n_v)}[field[1]]
    if field.startswith("w"):
        name = prefix + "attn_qkv.weight"
        shape = (c.n_embd, n_q + n_k + n_v)
        separate = prefix + LAYER_TENSORS[field][0]
        if separate in gguf.tensors:
            raise ModelFormatError(f"the model has both {name!r} and {separate!r}")
    else:
        name = prefix + "attn_qkv.bias"
        separate = prefix + LAYER_TENSORS[field][0]
        if name not in gguf.tensors:  # llama.cpp: a fused weight may come with separate biases
            if separate in gguf.tensors:
                return TensorRef(separate)
            if c.qkv_bias:
                raise ModelFormatError(f"the model has no tensor {name!r}, which {c.arch} needs")
            return None
        if separate in gguf.tensors:
            raise ModelFormatError(f"the model has both {name!r} and {separate!r}")
        shape = (n_q + n_k + n_v,)
    if gguf.tensors[name].shape != shape:
        raise ModelFormatError(f"tensor {name!r} has shape {gguf.tensors[name].shape}, expected {shape}")
    return TensorRef(name, start, stop)


def _check_shapes(gguf: GGUFFile, config: ModelConfig, refs: dict[str, TensorRef | None], layer: int) -> None:
    c = config
    head_dim, v_head_dim = c.layer_head_dim(layer), c.layer_v_head_dim(layer)  # by layer kind (gemma4)
    n_kv_heads, n_ff = c.layer_n_kv_heads(layer), c.layer_n_ff(layer)
    n_q_embd, n_kv_embd = c.n_heads * head_dim, n_kv_heads * head_dim
    q_norm = (n_q_embd,) if c.qk_norm_whole else (head_dim,)
    k_norm = (n_kv_embd,) if c.qk_norm_whole else (head_dim,)
    expected = {  # GGML order: (row length, rows)
        "wq": (c.n_embd, 2 * n_q_embd if c.attn_output_gate else n_q_embd), "wk": (c.n_embd, n_kv_embd),
        "wv": (c.n_embd, n_kv_heads * v_head_dim), "wo": (c.n_heads * v_head_dim, c.n_embd), "w_gate": (c.n_embd, n_ff),
        "w_up": (c.n_embd, n_ff), "w_down": (n_ff, c.n_embd), "attn_norm": (c.n_embd,), "ffn_norm": (c.n_embd,),
        "q_norm": q_norm, "k_norm": k_norm, "bq": (n_q_embd,), "bk": (n_kv_embd,),
        "w_router": (c.n_embd, c.n_expert), "w_gate_exps": (c.n_embd, c.n_ff_exp, c.n_expert),
        "w_up_exps": (c.n_embd, c.n_ff_exp, c.n_expert), "w_down_exps": (c.n_ff_exp, c.n_embd, c.n_expert),
        "bv": (n_kv_heads * v_head_dim,), "post_attn_norm": (c.n_embd,), "post_ffn_norm": (c.n_embd,),
        "bo": (c.n_embd,), "attn_sinks": (c.n_heads,), "b_router": (c.n_expert,), "exp_probs_b": (c.n_expert,),
        "b_gate_exps": (c.n_ff_exp, c.n_expert), "b_up_exps": (c.n_ff_exp, c.n_expert),
        "b_down_exps": (c.n_embd, c.n_expert), "w_gate_shexp": (c.n_embd, c.n_ff_shexp),
        "w_up_shexp": (c.n_embd, c.n_ff_shexp), "w_down_shexp": (c.n_ff_shexp, c.n_embd),
        "w_gate_inp_shexp": (c.n_embd,), "out_scale": (1,), "ple_gate": (c.n_embd, c.n_embd_per_layer),
        "ple_proj": (c.n_embd_per_layer, c.n_embd), "ple_norm": (c.n_embd,), "router_scale": (c.n_embd,),
        "pre_ffn_norm_2": (c.n_embd,), "post_ffn_norm_1": (c.n_embd,), "post_ffn_norm_2": (c.n_embd,),
        "down_exps_scale": (c.n_expert,),
    }
    for field, shape in expected.items():
        ref = refs.get(field)
        if ref is None:
            continue
        actual = gguf.tensors[ref.name].shape
        if not ref.is_whole:  # a row range of a fused tensor: the range's rows, same row length
            if ref.name.endswith("ffn_up.weight") and actual != (c.n_embd, 2 * c.n_ff):
                raise ModelFormatError(f"tensor {ref.name!r} has shape {actual}, expected {(c.n_embd, 2 * c.n_ff)}")
            rows = ref.row_stop - ref.row_start
            actual = (actual[0], rows) if len(actual) == 2 else (rows,)
        if actual != shape:
            raise ModelFormatError(f"tensor {ref.name!r} has shape {gguf.tensors[ref.name].shape}, expected {shape}")


def _check_no_unknown_tensors(gguf: GGUFFile, config: ModelConfig) -> None:
    """Every tensor in the file must be one this engine reads for the architecture."""
    known_layer = {suffix for suffix, _ in LAYER_TENSORS.values()} | {"attn_qkv.weight", "attn_qkv.bias"}
    if config.arch == "phi3":
        known_layer -= {"ffn_gate.weight"}
    # one FFN kind per model, but for gemma4's dense FFN beside its experts
    skipped = (() if config.ffn_dense_and_experts else DENSE_FFN_FIELDS) if config.is_moe else EXPERT_FIELDS
    known_layer -= {LAYER_TENSORS[field][0] for field in skipped}
    known_layer -= {LAYER_TENSORS[field][0] for field, used in CONDITIONAL_FIELDS.items() if not used(config)}
    known_layer -= {LAYER_TENSORS[field][0] for field, arch in ARCH_ONLY_FIELDS.items() if arch != config.arch}
    renamed = RENAMED_FIELDS.get(config.arch, {})
    known_layer -= {LAYER_TENSORS[field][0] for field in renamed}
    known_layer |= {name for name in renamed.values() if name is not None}
    if config.is_hybrid:
        known_layer |= set(DELTANET_TENSORS.values())
        known_layer -= {"attn_qkv.bias"}
    for name in gguf.tensors:
        if name == "output.weight" and config.arch == "gemma2":  # llama.cpp: gemma2's output is token_embd
            raise ModelFormatError("tensor 'output.weight' is not supported for gemma2 (its output is token_embd)")
        if name in GEMMA4_GLOBAL_TENSORS and config.n_embd_per_layer > 0:
            continue
        if name in GLOBAL_TENSORS:
            if name.startswith("rope_factors") and not config.rope_factors:
                raise ModelFormatError(f"tensor {name!r} is only used with LongRoPE scaling, which this "
                                       f"{config.arch} model's metadata does not ask for")
            continue
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < config.n_layers \
                and parts[2] in known_layer:
            continue
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() \
                and config.n_layers <= int(parts[1]) < config.n_layers + config.n_mtp_layers:
            continue  # a multi-token-prediction block (qwen35's NextN): llama.cpp loads it for drafting only
        raise ModelFormatError(f"tensor {name!r} is not supported for {config.arch} by this engine")


def output_tensor_name(gguf: GGUFFile, config: ModelConfig) -> str:
    """The output projection: ``output.weight``, or the token embedding when the two are tied."""
    if config.arch == "olmo2" and config.tied_embeddings:
        raise ModelFormatError("the model has no tensor 'output.weight', which olmo2 needs")
    name = "token_embd.weight" if config.tied_embeddings else "output.weight"
    shape = gguf.tensor(name).shape
    if shape != (config.n_embd, config.n_vocab):
        raise ModelFormatError(f"tensor {name!r} has shape {shape}, expected ({config.n_embd}, {config.n_vocab})")
    if gguf.tensor("output_norm.weight").shape != (config.n_embd,):
        raise ModelFormatError("tensor 'output_norm.weight' has the wrong shape")
    return name
