"""Writers of GGUF files for tests: a byte-level one for any structure, valid or not, and a tiny valid llama.

The byte-level writer (``u32``, ``string``, ``kv``, ``tensor_info``, ``RawGGUF``) lets a test lie about any
count, length, type or offset. ``write_tiny_llama`` writes a small random-weight llama model through
``gguf.GGUFWriter`` that a llama decoder and a GPT-2-style byte-level tokenizer can load.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, TokenType
from gguf.quants import quantize

Q = GGMLQuantizationType

# GGUF metadata value types (spec ids)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                   FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


# -- byte-level pieces ------------------------------------------------------------------------------------
def u32(x: int) -> bytes:
    return struct.pack("<I", x)


def u64(x: int) -> bytes:
    return struct.pack("<Q", x)


def string(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string; ``length`` overrides the stored length (to lie about it)."""
    raw = s.encode() if isinstance(s, str) else s
    return u64(len(raw) if length is None else length) + raw


def value(vtype: int, v: Any) -> bytes:
    """The encoding of a scalar or string value (no type tag)."""
    if vtype == STRING:
        return string(v)
    return struct.pack(_SCALAR_FORMATS[vtype], v)


def array(etype: int, values: Sequence[Any], length: int | None = None) -> bytes:
    """An array payload: element type, element count (or ``length``), then the elements."""
    body = b"".join(value(etype, v) for v in values)
    return u32(etype) + u64(len(values) if length is None else length) + body


def kv(key: str | bytes, vtype: int, v: Any) -> bytes:
    """One metadata pair. For ``vtype == ARRAY``, ``v`` is ``(element_type, values)``."""
    payload = array(*v) if vtype == ARRAY else value(vtype, v)
    return string(key) + u32(vtype) + payload


def tensor_info(name: str | bytes, shape: Sequence[int], qtype: int, offset: int, n_dims: int | None = None) -> bytes:
    """One tensor-info record; ``shape`` is in GGML order and ``n_dims`` may disagree with it."""
    dims = b"".join(u64(d) for d in shape)
    return string(name) + u32(len(shape) if n_dims is None else n_dims) + dims + u32(qtype) + u64(offset)


def tensor_nbytes(shape: Sequence[int], qtype: int) -> int:
    block_size, type_size = GGML_QUANT_SIZES[Q(qtype)]
    return int(np.prod(shape)) // block_size * type_size


def pad_to(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclasses.dataclass
class RawGGUF:
    """A GGUF file as a list of named byte sections; every field can be set to anything.

    ``n_tensors``/``n_kv`` default to the number of records given. The data section starts at the
    header's end padded to ``alignment`` (which only places the data; put a ``general.alignment`` pair
    in ``kvs`` to declare it).
    """

    kvs: list[bytes] = dataclasses.field(default_factory=list)
    infos: list[bytes] = dataclasses.field(default_factory=list)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32

    def sections(self) -> list[tuple[str, bytes]]:
        parts = [("magic", self.magic), ("version", u32(self.version)),
                 ("tensor count", u64(len(self.infos) if self.n_tensors is None else self.n_tensors)),
                 ("metadata count", u64(len(self.kvs) if self.n_kv is None else self.n_kv))]
        parts += [(f"metadata #{i}", b) for i, b in enumerate(self.kvs)]
        parts += [(f"tensor info #{i}", b) for i, b in enumerate(self.infos)]
        header_size = sum(len(b) for _, b in parts)
        parts.append(("padding", bytes(pad_to(header_size, self.alignment) - header_size)))
        parts.append(("data", self.data))
        return parts

    def boundaries(self) -> list[tuple[str, int]]:
        """(section name, offset just past it) for every non-empty section."""
        out, pos = [], 0
        for name, b in self.sections():
            pos += len(b)
            if b:
                out.append((name, pos))
        return out

    def to_bytes(self) -> bytes:
        return b"".join(b for _, b in self.sections())

    def write(self, path: str | Path) -> Path:
        Path(path).write_bytes(self.to_bytes())
        return Path(path)


def build(tensors: Sequence[tuple[str, Sequence[int], int]], kvs: Sequence[bytes] = (), alignment: int = 32,
          seed: int = 0, **fields: Any) -> RawGGUF:
    """A valid file holding ``tensors`` ((name, GGML shape, type) each) packed in order with random bytes.

    Extra keyword arguments set ``RawGGUF`` fields (e.g. ``version=2``) after the layout is made.
    """
    rng = np.random.default_rng(seed)
    infos, data = [], bytearray()
    for name, shape, qtype in tensors:
        infos.append(tensor_info(name, shape, qtype, len(data)))
        data += rng.integers(0, 256, tensor_nbytes(shape, qtype), dtype=np.uint8).tobytes()
        data += bytes(pad_to(len(data), alignment) - len(data))
    return dataclasses.replace(RawGGUF(list(kvs), infos, bytes(data), alignment=alignment), **fields)


def small_valid(**fields: Any) -> RawGGUF:
    """A minimal valid file: two metadata pairs and three tensors of different types; ``fields`` as for ``build``."""
    kvs = fields.pop("kvs", [kv("general.architecture", STRING, "llama"), kv("general.alignment", UINT32, 32)])
    tensors = [("a.weight", (8, 2), Q.F32), ("b.weight", (32, 3), Q.Q8_0), ("c.weight", (64,), Q.F16)]
    return build(tensors, kvs, **fields)


# -- a tiny valid llama model ---------------------------------------------------------------------------
TINY_MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s")
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Default tensor types by name suffix; quantized types need row lengths that are multiples of 32.
DEFAULT_TYPES: dict[str, GGMLQuantizationType] = {
    "token_embd.weight": Q.F16,
    "attn_norm.weight": Q.F32,
    "attn_q.weight": Q.Q8_0,
    "attn_k.weight": Q.Q8_0,
    "attn_v.weight": Q.Q4_0,
    "attn_output.weight": Q.F16,
    "ffn_norm.weight": Q.F32,
    "ffn_gate.weight": Q.Q4_0,
    "ffn_up.weight": Q.Q8_0,
    "ffn_down.weight": Q.Q4_0,
    "output_norm.weight": Q.F32,
    "output.weight": Q.Q8_0,
}


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level mapping: the printable character standing for each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return [chars[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte tokens, one token per merge, then the control tokens."""
    tokens = byte_level_alphabet() + [m.replace(" ", "") for m in TINY_MERGES] + list(TINY_SPECIALS)
    types = [int(TokenType.NORMAL)] * (len(tokens) - len(TINY_SPECIALS)) + [int(TokenType.CONTROL)] * len(TINY_SPECIALS)
    return tokens, types, list(TINY_MERGES)


TINY_VOCAB_SIZE = 256 + len(TINY_MERGES) + len(TINY_SPECIALS)


def _infer_type(v: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    if isinstance(v, bool):
        return GGUFValueType.BOOL, None
    if isinstance(v, int):
        return (GGUFValueType.UINT32 if 0 <= v < 1 << 32 else GGUFValueType.INT64), None
    if isinstance(v, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(v, str):
        return GGUFValueType.STRING, None
    if isinstance(v, (list, tuple)) and v:
        return GGUFValueType.ARRAY, _infer_type(v[0])[0]
    raise TypeError(f"cannot infer a GGUF type for {v!r}; pass (value, GGUFValueType)")


def _tiny_metadata(n_layers: int, n_embd: int, n_heads: int, n_kv_heads: int, n_ff: int, n_ctx: int) -> dict[str, Any]:
    tokens, types, merges = tiny_vocab()
    endoftext, im_end = tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")
    return {
        "general.name": "tiny-llama",
        "llama.vocab_size": len(tokens),
        "llama.context_length": n_ctx,
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layers,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv_heads,
        "llama.rope.dimension_count": n_embd // n_heads,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY, GGUFValueType.INT32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": endoftext,
        "tokenizer.ggml.eos_token_id": im_end,
        "tokenizer.ggml.padding_token_id": endoftext,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def _tiny_shapes(n_layers: int, n_embd: int, n_kv_embd: int, n_ff: int, n_vocab: int, tied: bool) -> list[tuple[str, tuple[int, ...]]]:
    """(name, GGML shape) of every tensor, in llama.cpp's names and order."""
    shapes = [("token_embd.weight", (n_embd, n_vocab))]
    for il in range(n_layers):
        shapes += [(f"blk.{il}.{suffix}", shape) for suffix, shape in (
            ("attn_norm.weight", (n_embd,)), ("attn_q.weight", (n_embd, n_embd)),
            ("attn_k.weight", (n_embd, n_kv_embd)), ("attn_v.weight", (n_embd, n_kv_embd)),
            ("attn_output.weight", (n_embd, n_embd)), ("ffn_norm.weight", (n_embd,)),
            ("ffn_gate.weight", (n_embd, n_ff)), ("ffn_up.weight", (n_embd, n_ff)),
            ("ffn_down.weight", (n_ff, n_embd)))]
    shapes.append(("output_norm.weight", (n_embd,)))
    if not tied:
        shapes.append(("output.weight", (n_embd, n_vocab)))
    return shapes


def _encode_tensor(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if qtype == Q.F32:
        return values.astype(np.float32)
    if qtype == Q.F16:
        return values.astype(np.float16)
    return quantize(values.astype(np.float32), qtype)


def write_tiny_llama(path: str | Path, *, n_layers: int = 2, n_embd: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                     n_ff: int = 128, n_ctx: int = 256, seed: int = 0, tie_embeddings: bool = True,
                     tensor_types: dict[str, GGMLQuantizationType | str] | None = None,
                     metadata: dict[str, Any] | None = None, weight_std: float = 0.02,
                     quantizer: Callable[[np.ndarray, GGMLQuantizationType], np.ndarray] = quantize) -> Path:
    """Write a tiny random-weight llama model with a byte-level GPT-2-style tokenizer and a ChatML template.

    Args:
        path: where to write the file.
        n_layers, n_embd, n_heads, n_kv_heads, n_ff, n_ctx: the hyper-parameters (head_dim = n_embd // n_heads).
        seed: seeds the random weights; the same arguments always give the same bytes.
        tie_embeddings: without an ``output.weight`` tensor when True.
        tensor_types: type by tensor-name suffix (``"attn_q.weight": "F32"``) over ``DEFAULT_TYPES``.
        metadata: keys to add or replace (``None`` removes one, except general.architecture); a value's GGUF
            type is inferred, or given as ``(value, GGUFValueType)`` or ``(values, GGUFValueType.ARRAY, element_type)``.
        weight_std: the standard deviation of the matrices' random weights (larger makes larger logits).
        quantizer: ``(values, qtype) -> blocks`` for the quantized types (default: the gguf package's).

    Returns:
        ``path`` as a ``Path``.
    """
    types = {**DEFAULT_TYPES, **{k: Q[v] if isinstance(v, str) else Q(v) for k, v in (tensor_types or {}).items()}}
    meta = {**_tiny_metadata(n_layers, n_embd, n_heads, n_kv_heads, n_ff, n_ctx), **(metadata or {})}
    if meta.get("general.architecture", "") is None:
        raise ValueError("general.architecture can be replaced but not removed; use RawGGUF for that")
    arch = meta.get("general.architecture", "llama")
    if isinstance(arch, str):
        meta.pop("general.architecture", None)
    writer = GGUFWriter(path, arch if isinstance(arch, str) else "llama")  # a non-string one is written over it below
    for key, v in meta.items():
        if v is None:
            continue
        if not (isinstance(v, tuple) and len(v) in (2, 3) and isinstance(v[1], GGUFValueType)):
            v = (v, *_infer_type(v))
        writer.add_key_value(key, v[0], v[1], v[2] if len(v) == 3 else None)
    rng = np.random.default_rng(seed)
    n_kv_embd = n_kv_heads * (n_embd // n_heads)
    for name, shape in _tiny_shapes(n_layers, n_embd, n_kv_embd, n_ff, TINY_VOCAB_SIZE, tie_embeddings):
        qtype = types[name.split(".", 2)[-1] if name.startswith("blk.") else name]
        if len(shape) == 1:
            values = 1.0 + 0.1 * rng.standard_normal(shape[::-1])
        else:
            values = weight_std * rng.standard_normal(shape[::-1])  # numpy order: (rows, row length)
        encoded = _encode_tensor(values, qtype) if qtype in (Q.F32, Q.F16) else quantizer(values.astype(np.float32), qtype)
        writer.add_tensor(name, encoded, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
