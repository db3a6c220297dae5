"""ModelConfig: the decoder's hyper-parameters and architecture switches, read from GGUF metadata.

Architecture differences (q/k/v bias, q/k norms, extra post-norms, sliding-window layers, activation,
embedding scale, RoPE layout) are fields here, so every backend implements one decoder that reads them.
"""

from __future__ import annotations

import dataclasses
import math

from .gguf_file import GGUFFile, ModelFormatError
from .packed_strings import PackedStrings

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")
MAX_LAYERS = 1024
MAX_HEADS = 4096


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # per-head width of queries and keys
    v_head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool  # True: rotate halves (x[i], x[i+d/2]); False: adjacent pairs (x[2i], x[2i+1])
    rope_scale: float = 1.0  # linear position scaling (positions are divided by it)
    rope_base_local: float | None = None  # RoPE base of sliding-window layers where it differs
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # norm on the attention and FFN outputs before the residual add
    activation: str = "silu"  # "silu" or "gelu_tanh", applied to the gate
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # multiplier of q·k; filled in __post_init__ when 0
    sliding_window: int = 0  # 0: no sliding-window layers
    swa_pattern: int = 0  # layers with il % swa_pattern < swa_pattern - 1 use the sliding window
    tied_embeddings: bool = True
    has_rope_freqs: bool = False  # a rope_freqs tensor divides the frequencies (Llama 3.1 scaling)

    def __post_init__(self):
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def n_q_embd(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def n_kv_embd(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends only to the last ``sliding_window`` positions."""
        return self.sliding_window > 0 and self.swa_pattern > 0 and layer % self.swa_pattern < self.swa_pattern - 1

    def layer_rope_base(self, layer: int) -> float:
        if self.rope_base_local is not None and self.is_sliding(layer):
            return self.rope_base_local
        return self.rope_base

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelConfig:
        """Build the config from a GGUF file's metadata and tensor list; unknown keys are ignored."""
        arch = gguf.get("general.architecture", str)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFormatError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def num(key: str, default=dataclasses.MISSING, kind=int):
            return gguf.get(f"{arch}.{key}", kind, default)

        n_embd = _positive(num("embedding_length"), "embedding_length", 1 << 20)
        n_heads = _positive(num("attention.head_count"), "attention.head_count", MAX_HEADS)
        n_kv_heads = _positive(num("attention.head_count_kv", n_heads), "attention.head_count_kv", MAX_HEADS)
        if n_heads % n_kv_heads:
            raise ModelFormatError(f"head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")
        head_dim = _positive(num("attention.key_length", n_embd // n_heads), "attention.key_length", 1 << 14)
        embd = gguf.tensor("token_embd.weight")
        fields = dict(
            arch=arch,
            n_layers=_positive(num("block_count"), "block_count", MAX_LAYERS),
            n_embd=n_embd,
            n_ff=_positive(num("feed_forward_length"), "feed_forward_length", 1 << 20),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            v_head_dim=_positive(num("attention.value_length", head_dim), "attention.value_length", 1 << 14),
            n_vocab=embd.shape[1] if len(embd.shape) == 2 else 0,
            n_ctx_train=_positive(num("context_length", 2048), "context_length", 1 << 24),
            rms_eps=num("attention.layer_norm_rms_epsilon", 1e-5, float),
            rope_base=num("rope.freq_base", 10000.0, float),
            rope_dim=_positive(num("rope.dimension_count", head_dim), "rope.dimension_count", head_dim),
            rope_neox=arch != "llama",
            qkv_bias="blk.0.attn_q.bias" in gguf.tensors,
            tied_embeddings="output.weight" not in gguf.tensors,
            has_rope_freqs="rope_freqs.weight" in gguf.tensors,
        )
        if embd.shape[0] != n_embd or fields["n_vocab"] <= 0:
            raise ModelFormatError(f"token_embd.weight has shape {embd.shape}, expected ({n_embd}, n_vocab)")
        tokens = gguf.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, PackedStrings) and len(tokens) > fields["n_vocab"]:  # fewer is fine: padded embeddings
            raise ModelFormatError(f"the tokenizer has {len(tokens)} tokens but token_embd.weight has only "
                                   f"{fields['n_vocab']} rows: token ids from {fields['n_vocab']} on have no embedding")
        if gguf.get(f"{arch}.rope.scaling.type", str, "none") == "linear":
            fields["rope_scale"] = num("rope.scaling.factor", 1.0, float)
        if arch == "gemma3":
            fields.update(
                qk_norm=True,
                post_norms=True,
                activation="gelu_tanh",
                embed_scale=math.sqrt(n_embd),
                rope_base_local=10000.0,
                sliding_window=num("attention.sliding_window", 0),
                swa_pattern=6,
                # llama.cpp: 1/sqrt(n_embd/n_head) for the 27B model, 1/sqrt(head_dim) for the others
                attn_scale=1.0 / math.sqrt(n_embd // n_heads if n_embd == 5376 else head_dim),
            )
        return cls(**fields)


def _positive(value: int, key: str, limit: int) -> int:
    if not 0 < value <= limit:
        raise ModelFormatError(f"metadata {key} = {value} is out of range (1 to {limit})")
    return value
