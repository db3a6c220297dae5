"""A GGUF vocabulary read as llama.cpp reads it: token attributes, special ids, end-of-generation set, flags."""

from __future__ import annotations

import array
import dataclasses
from typing import Any

import numpy as np

from engine.gguf_file import ModelFormatError
from engine.packed_strings import PackedStrings, StringIndex
from engine.pretokenizer_rules import KINDS

# llama.cpp's llama_token_attr bits
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
_ATTR_OF_TYPE = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}  # others: UNDEFINED

_KEY = "tokenizer.ggml."
# (metadata key, field) in llama.cpp's order; a later key for the same field wins.
_SPECIAL_KEYS = (
    ("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"), ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"), ("seperator_token_id", "sep"), ("padding_token_id", "pad"),
    ("mask_token_id", "mask"), ("fim_pre_token_id", "fim_pre"), ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"), ("fim_pad_token_id", "fim_pad"), ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"), ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)
# Special ids llama.cpp finds by token text when the metadata does not name them.
_BY_TEXT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss
# Control tokens a reply's text keeps when the chat template uses them: reasoning markers the app splits on
# (llama.cpp's server keeps them as "preserved tokens" for the same reason).
_PRESERVED_IF_TEMPLATED = ("[THINK]", "[/THINK]")  # Magistral, Ministral 3 Reasoning


@dataclasses.dataclass
class Vocab:
    """Everything the tokenizer needs from the metadata, after llama.cpp's fix-ups."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str
    texts: PackedStrings  # (n_vocab,)
    attrs: array.array  # (n_vocab,) int32 llama_token_attr bits
    scores: np.ndarray  # (n_vocab,) float32
    merges: PackedStrings  # "left right", rank order; empty for SentencePiece
    token_to_id: StringIndex  # over texts
    special: dict[str, int | None]
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    ignore_merges: bool
    preserved: frozenset[int] = frozenset()  # control tokens decoded as text even when special tokens are skipped


def load_vocab(metadata: dict[str, Any]) -> Vocab:
    """Build the vocabulary from GGUF metadata, raising ModelFormatError on anything llama.cpp would refuse."""
    model = _string(metadata, "model", required=True)
    if model not in ("gpt2", "llama"):
        raise ModelFormatError(f"unsupported tokenizer model {model!r} (supported: 'gpt2', 'llama')")
    texts = _token_texts(metadata)
    n = len(texts)
    token_to_id = StringIndex(texts)
    if token_to_id.duplicates:
        raise ModelFormatError(f"{_KEY}tokens has duplicate tokens ({token_to_id.duplicates} repeated)")
    pre, flags, special = _model_defaults(model, metadata)
    vocab = Vocab(model, pre, texts, _attributes(metadata, n), _scores(metadata, n), _merges(metadata, model),
                  token_to_id, special, frozenset(), **flags)
    _read_special_ids(vocab, metadata)
    _read_add_flags(vocab, metadata)
    _detect_special_by_text(vocab)
    _mark_unused(vocab)
    vocab.eog_ids = frozenset(_end_of_generation(vocab))
    vocab.preserved = _preserved(vocab, metadata.get("tokenizer.chat_template"))
    _model_specific_attrs(vocab, str(metadata.get("general.name", "")).lower(), pre,
                          str(metadata.get("general.architecture", "")))
    return vocab


def _string(metadata: dict[str, Any], key: str, required: bool = False) -> str | None:
    value = metadata.get(_KEY + key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ModelFormatError(f"{_KEY}{key} is missing or not a string")
    return value


def _string_array(metadata: dict[str, Any], key: str) -> PackedStrings:
    """A string array from the GGUF reader (packed) or from a hand-built metadata dict (a list of str)."""
    value = metadata.get(_KEY + key)
    if isinstance(value, list) and set(map(type, value)) <= {str}:
        return PackedStrings.from_strings(value)
    if not isinstance(value, PackedStrings):
        raise ModelFormatError(f"{_KEY}{key} is missing or not an array of strings")
    return value


def _token_texts(metadata: dict[str, Any]) -> PackedStrings:
    texts = _string_array(metadata, "tokens")
    if not len(texts):
        raise ModelFormatError(f"{_KEY}tokens is empty")
    if not (texts.byte_lengths() == 0).any():
        return texts
    # llama.cpp keeps empty entries addressable under a placeholder name
    return PackedStrings.from_strings(t if t else f"[EMPTY_{i}]" for i, t in enumerate(texts))


def _numeric_array(metadata: dict[str, Any], key: str, n: int, kinds: str) -> np.ndarray | None:
    value = metadata.get(_KEY + key)
    if value is None:
        return None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds or value.ndim != 1:
        raise ModelFormatError(f"{_KEY}{key} has the wrong type")
    if len(value) < n:
        raise ModelFormatError(f"{_KEY}{key} has {len(value)} entries for {n} tokens")
    return value[:n]


def _scores(metadata: dict[str, Any], n: int) -> np.ndarray:
    scores = _numeric_array(metadata, "scores", n, "fi")
    return np.zeros(n, np.float32) if scores is None else scores.astype(np.float32)


def _attributes(metadata: dict[str, Any], n: int) -> array.array:
    types = _numeric_array(metadata, "token_type", n, "iu")
    if types is None:
        return array.array("i", [NORMAL]) * n
    attr_of_type = np.array([_ATTR_OF_TYPE.get(t, UNDEFINED) for t in range(8)], dtype=np.int32)
    known = (types >= 0) & (types < 8)
    attrs = np.where(known, attr_of_type[np.where(known, types, 0)], UNDEFINED).astype(np.int32)
    return array.array("i", attrs.tobytes())


def _merges(metadata: dict[str, Any], model: str) -> PackedStrings:
    if model != "gpt2":
        return PackedStrings(b"", [])
    return _string_array(metadata, "merges")


def _model_defaults(model: str, metadata: dict[str, Any]) -> tuple[str, dict[str, bool], dict[str, int | None]]:
    special: dict[str, int | None] = dict.fromkeys(
        ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
         "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"))
    if model == "llama":
        special.update(bos=1, eos=2, unk=0)
        flags = dict(add_bos=True, add_eos=False, add_space_prefix=True, clean_spaces=False, ignore_merges=False)
        pre = "default"
    else:
        pre = _string(metadata, "pre") or "default"
        if pre not in KINDS:
            raise ModelFormatError(f"unsupported pre-tokenizer {_KEY}pre = {pre!r}")
        kind = KINDS[pre]
        special.update(bos=None if kind.no_bos else 11, eos=11)
        flags = dict(add_bos=kind.add_bos, add_eos=False, add_space_prefix=False, clean_spaces=kind.clean_spaces,
                     ignore_merges=kind.ignore_merges)
    prefix = metadata.get(_KEY + "add_space_prefix")
    if prefix is not None:
        flags["add_space_prefix"] = _boolean(prefix, "add_space_prefix")
    return pre, flags, special


def _boolean(value: Any, key: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ModelFormatError(f"{_KEY}{key} is not a boolean")
    return bool(value)


def _read_special_ids(vocab: Vocab, metadata: dict[str, Any]) -> None:
    n = len(vocab.texts)
    for field, default in vocab.special.items():
        if default is not None and default >= n:  # a built-in default the vocabulary is too small for
            vocab.special[field] = None
    for key, field in _SPECIAL_KEYS:
        value = metadata.get(_KEY + key)
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ModelFormatError(f"{_KEY}{key} is not an integer")
        if not 0 <= value < n:
            raise ModelFormatError(f"{_KEY}{key} = {value} is outside the vocabulary (size {n})")
        vocab.special[field] = int(value)


def _read_add_flags(vocab: Vocab, metadata: dict[str, Any]) -> None:
    for name in ("add_bos", "add_eos"):
        value = metadata.get(f"{_KEY}{name}_token")
        if value is not None:
            setattr(vocab, name, _boolean(value, f"{name}_token"))
    add_sep = metadata.get(_KEY + "add_sep_token")
    checks = (("add_bos_token", vocab.add_bos, "bos"), ("add_eos_token", vocab.add_eos, "eos"),
              ("add_sep_token", add_sep is not None and _boolean(add_sep, "add_sep_token"), "sep"))
    for key, wanted, field in checks:
        if wanted and vocab.special[field] is None:
            raise ModelFormatError(f"{_KEY}{key} is true, but the model has no {field} token")


def _detect_special_by_text(vocab: Vocab) -> None:
    # llama.cpp takes the first match in hash-map order; we take the lowest id, which is deterministic
    for field, names in _BY_TEXT.items():
        if vocab.special[field] is not None:
            continue
        ids = [vocab.token_to_id[t] for t in names if t in vocab.token_to_id]
        if ids:
            vocab.special[field] = min(ids)
            vocab.attrs[min(ids)] |= CONTROL


def _mark_unused(vocab: Vocab) -> None:
    for i in np.flatnonzero(np.array(vocab.attrs) & CONTROL).tolist():
        if "unused" in vocab.texts[i]:
            vocab.attrs[i] |= UNUSED


def _end_of_generation(vocab: Vocab) -> set[int]:
    special, attrs = vocab.special, vocab.attrs
    eog = {special[f] for f in ("fim_pad", "fim_rep", "fim_sep") if special[f] is not None}
    for text in _EOG_TEXTS:
        tid = vocab.token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= CONTROL
    for text in _ALWAYS_RENDERED:
        if text in vocab.token_to_id:
            attrs[vocab.token_to_id[text]] = USER_DEFINED
    eog.update(special[f] for f in ("eos", "eot", "eom") if special[f] is not None)
    by_text = {vocab.texts[i]: i for i in eog}
    # gpt-oss and solar-open: <|end|> ends a message, not the generation
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = USER_DEFINED
    # gemma4 and plamo: </s> is ordinary text there
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = NORMAL
    return eog


def _preserved(vocab: Vocab, template: Any) -> frozenset[int]:
    if not isinstance(template, str):
        return frozenset()
    ids = vocab.token_to_id
    return frozenset(ids[text] for text in _PRESERVED_IF_TEMPLATED if text in template and text in ids)


def _model_specific_attrs(vocab: Vocab, name: str, pre: str, arch: str) -> None:
    """Strip flags llama.cpp sets by model name (its GGUF files carry no per-token strip attributes)."""
    ids = vocab.token_to_id
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            a in arch for a in ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in ids:
            vocab.attrs[ids["<mask>"]] |= LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i, attr in enumerate(vocab.attrs):
            if attr & (CONTROL | USER_DEFINED | UNKNOWN):
                vocab.attrs[i] = attr | RSTRIP
        for text, strip in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text in ids:
                attr = vocab.attrs[ids[text]]
                vocab.attrs[ids[text]] = attr | RSTRIP if strip else attr & ~RSTRIP
    elif "modern-bert" in name and "[MASK]" in ids:
        vocab.attrs[ids["[MASK]"]] |= LSTRIP
