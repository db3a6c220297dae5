"""Text to token ids and back, token for token as llama.cpp's llama_tokenize and llama_detokenize."""

from __future__ import annotations

import array
import codecs
import functools
import heapq
import operator
import re
from typing import Iterable

import numpy as np

from engine.gguf_file import GGUFFile, ModelFormatError
from engine.packed_strings import StringIndex, string_extension
from engine.pretokenizer import PreTokenizer
from engine.vocab import BYTE, CONTROL, LSTRIP, NORMAL, RSTRIP, UNKNOWN, USER_DEFINED, Vocab, load_vocab

SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space
_C_SPACES = " \t\n\v\f\r"  # isspace() in the C locale
_WORD_CACHE_SIZE = 1 << 15


def _byte_level_alphabet() -> list[str]:
    """GPT-2's reversible map from bytes to printable code points (bytes that print stay themselves)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + extra)
            extra += 1
    return [alphabet[b] for b in range(256)]


_BYTE_TO_CHAR = _byte_level_alphabet()
_CHAR_TO_BYTE = {ch: b for b, ch in enumerate(_BYTE_TO_CHAR)}
_LATIN1_TO_BYTE_LEVEL = {b: ch for b, ch in enumerate(_BYTE_TO_CHAR)}  # for str.translate over latin-1 text


class Tokenizer:
    """A GGUF model's tokenizer: byte-level BPE ("gpt2") or SentencePiece with scores ("llama").

    Attributes:
        n_vocab: number of tokens.
        bos_id, eos_id: beginning / end of sequence ids, or None.
        eog_ids: ids that end a generation, by llama.cpp's rules (eos, eot, <|im_end|>, <end_of_turn>, ...).
        add_bos, add_eos: whether ``encode(..., add_special=True)`` adds them.
    """

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._texts, self._attrs = vocab.texts, vocab.attrs
        self.n_vocab = len(vocab.texts)
        self.bos_id, self.eos_id = vocab.special["bos"], vocab.special["eos"]
        self.eog_ids = vocab.eog_ids
        self.add_bos, self.add_eos = vocab.add_bos, vocab.add_eos
        self.add_space_prefix, self.clean_spaces = vocab.add_space_prefix, vocab.clean_spaces
        self._is_spm = vocab.model == "llama"
        self._pre = None if self._is_spm else PreTokenizer(vocab.pre)
        self._pieces: dict[int, bytes] = {}
        self._preserved = vocab.preserved  # control tokens written out even with skip_special (reasoning markers)
        self._bpe_word = functools.lru_cache(maxsize=_WORD_CACHE_SIZE)(self._bpe_word_uncached)
        if not self._is_spm and string_extension() is not None:
            self._merge_ranks  # built now, with the model (in C, GIL released), not at the first prompt's prefill

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "Tokenizer":
        """Read the ``tokenizer.ggml.*`` metadata of a GGUF file.

        Raises:
            ModelFormatError: the metadata is missing, malformed, or names an unsupported tokenizer.
        """
        return cls(load_vocab(gguf.metadata))

    # -- queries ---------------------------------------------------------------------------------------
    def token_text(self, id: int) -> str:
        """The token's vocabulary string, as stored in the GGUF file."""
        return self._texts[self._check_id(id)]

    def is_special(self, id: int) -> bool:
        """True for control and unknown tokens: the ones ``skip_special`` leaves out of decoded text."""
        return bool(self._attrs[self._check_id(id)] & (CONTROL | UNKNOWN))

    def token_to_bytes(self, id: int, skip_special: bool = False) -> bytes:
        """The raw bytes of one token's piece (llama.cpp's ``llama_token_to_piece``).

        Args:
            id: the token id.
            skip_special: give b"" for control and unknown tokens instead of their text (except the reasoning
                markers the chat template uses, ``Vocab.preserved``).

        Returns:
            The bytes; a piece may be part of a multi-byte character (see ``IncrementalDecoder``).

        Raises:
            ValueError: the id is outside the vocabulary.
        """
        return self._piece(self._check_id(id), not skip_special)

    # -- encoding --------------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for ``text``, as llama.cpp's ``llama_tokenize``.

        Args:
            text: the text to tokenize.
            add_special: add BOS / EOS where the model asks for them (``add_bos`` / ``add_eos``).
            parse_special: match control tokens written in the text (e.g. ``<|im_start|>``) as single
                tokens; otherwise they are tokenized as plain text. User-defined tokens always match.

        Returns:
            The token ids.
        """
        fragments = self._partition(text, parse_special) if text else []
        ids = [self.bos_id] if add_special and self.add_bos else []
        if self._is_spm:
            self._encode_spm_fragments(fragments, ids)
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    ids.append(fragment)
                else:
                    for word in self._pre.split(fragment):
                        ids.extend(self._bpe_word(word))
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _encode_spm_fragments(self, fragments: list[str | int], ids: list[int]) -> None:
        after_special = True  # the text's start counts as following a special token
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                fragment = " " + fragment
            ids.extend(self._spm(fragment.replace(" ", SPACE_ESCAPE)))
            after_special = False

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut out special tokens written in the text, longest first (llama.cpp's tokenizer_st_partition)."""
        fragments: list[str | int] = [text]
        for tid, token in self._special_tokens_in(text, parse_special):
            attr = self._attrs[tid]
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or token not in fragment:
                    cut.append(fragment)
                else:
                    _split_on_token(fragment, token, tid, attr, cut)
            fragments = cut
        return fragments

    def _special_tokens_in(self, text: str, parse_special: bool) -> list[tuple[int, str]]:
        present = {text[i:i + 2] for i in range(len(text) - 1)} | set(text)
        candidates = self._special_order[parse_special]
        return [(tid, token) for tid, token in candidates if token[:2] in present and token in text]

    @functools.cached_property
    def _special_order(self) -> dict[bool, list[tuple[int, str]]]:
        """Special tokens (id, text), longest first: all of them, and those matched without parse_special."""
        attrs = np.frombuffer(self._attrs, np.int32)  # a NumPy scan: a Python loop over 10^5 tokens holds the GIL
        special = [(i, self._texts[i]) for i in np.flatnonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN)).tolist()]
        special.sort(key=lambda token: -len(token[1].encode("utf-8")))
        plain = [token for token in special if not self._attrs[token[0]] & (CONTROL | UNKNOWN)]
        return {True: special, False: plain}

    # -- byte-level BPE --------------------------------------------------------------------------------
    @functools.cached_property
    def _merge_ranks(self) -> StringIndex:
        """Merge rank keyed by "left right"; the first of duplicate merges wins, as in llama.cpp."""
        return StringIndex(self._vocab.merges)

    def _bpe_word_uncached(self, word: str) -> tuple[int, ...]:
        encoded = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)
        token_to_id = self._vocab.token_to_id
        if self._vocab.ignore_merges and encoded in token_to_id:
            return (token_to_id[encoded],)
        ids = []
        for symbol in _bpe_merge(list(encoded), self._merge_ranks):
            tid = token_to_id.get(symbol)
            if tid is not None:
                ids.append(tid)
            else:  # llama.cpp falls back to single-byte tokens, which only ASCII characters can match
                ids.extend(token_to_id[ch] for ch in symbol if ord(ch) < 128 and ch in token_to_id)
        return tuple(ids)

    # -- SentencePiece ---------------------------------------------------------------------------------
    @functools.cached_property
    def _scores(self) -> array.array:
        """The scores as an array.array: indexing it gives Python floats without a list of 10^5 of them."""
        return array.array("f", self._vocab.scores.astype("float32").tobytes())

    def _spm(self, text: str) -> list[int]:
        token_to_id = self._vocab.token_to_id
        ids = []
        for symbol in _spm_merge(list(text), token_to_id, self._scores):
            tid = token_to_id.get(symbol)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self._byte_token(b) for b in symbol.encode("utf-8", "surrogatepass"))
        return ids

    def _byte_token(self, byte: int) -> int:
        token_to_id = self._vocab.token_to_id
        tid = token_to_id.get(f"<0x{byte:02X}>", token_to_id.get(chr(byte)) if byte < 128 else None)
        if tid is None:
            raise ModelFormatError(f"the vocabulary has no byte-fallback token for byte 0x{byte:02X}")
        return tid

    # -- decoding --------------------------------------------------------------------------------------
    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text for token ids, as llama.cpp's ``llama_detokenize``.

        Args:
            ids: token ids.
            skip_special: leave out control tokens (and a leading BOS / trailing EOS the model adds), except the
                reasoning markers the chat template uses (``Vocab.preserved``); otherwise they are written out as
                their text.

        Returns:
            The text; byte sequences that are not valid UTF-8 become U+FFFD.

        Raises:
            ValueError: an id is outside the vocabulary.
        """
        ids = [self._check_id(i) for i in ids]
        strip_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            strip_space, ids = False, ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        pieces = [self._piece(i, not skip_special) for i in ids]
        if strip_space and pieces and pieces[0][:1] == b" ":  # the space SentencePiece put in front
            pieces[0] = pieces[0][1:]
        raw = b"".join(pieces)
        if self.clean_spaces:
            raw = clean_up_spaces(raw)
        return raw.decode("utf-8", "replace")

    def _piece(self, tid: int, special: bool) -> bytes:
        attr = self._attrs[tid]
        if not special and attr & (UNKNOWN | CONTROL) and tid not in self._preserved:
            return b""
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = self._render(tid, attr)
        return piece

    def _render(self, tid: int, attr: int) -> bytes:
        text = self._texts[tid]
        if attr & (UNKNOWN | CONTROL | USER_DEFINED):
            return text.encode("utf-8")
        if attr & NORMAL:
            if self._is_spm:
                return text.replace(SPACE_ESCAPE, " ").encode("utf-8")
            return _byte_level_decode(text)
        if attr & BYTE:
            return bytes([_hex_prefix(text[3:5])])
        return b""

    def _check_id(self, tid: int) -> int:
        try:
            tid = operator.index(tid)
        except TypeError:
            raise ValueError(f"token id {tid!r} is not an integer") from None
        if not 0 <= tid < self.n_vocab:
            raise ValueError(f"token id {tid} is outside the vocabulary (0..{self.n_vocab - 1})")
        return tid


class IncrementalDecoder:
    """Streaming decode: feed ids one at a time and get text that never splits a UTF-8 character.

    The concatenation of everything ``add`` and ``flush`` return equals ``tokenizer.decode(ids,
    skip_special)`` for the same ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok, self._skip = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._first, self._strip_space = True, tokenizer.add_space_prefix
        self._held_eos = b""  # a possibly-final EOS, which decode drops when skip_special
        self._unclean = b""  # bytes whose space clean-up may still depend on what follows

    def add(self, id: int) -> str:
        """Text newly completed by this token ('' while a multi-byte character is pending)."""
        tok = self._tok
        tid = tok._check_id(id)
        raw, self._held_eos = self._held_eos, b""
        if self._first and self._skip and tok.add_bos and tid == tok.bos_id:
            self._first, self._strip_space = False, False
            return ""
        self._first = False
        piece = tok._piece(tid, not self._skip)
        if self._strip_space:
            piece = piece[1:] if piece[:1] == b" " else piece
            self._strip_space = False
        if self._skip and tok.add_eos and tid == tok.eos_id:
            self._held_eos = piece
            return self._emit(raw)
        return self._emit(raw + piece)

    def flush(self) -> str:
        """Any remainder; bytes that never formed a valid character become U+FFFD."""
        rest = clean_up_spaces(self._unclean) if self._unclean else b""
        self._unclean = self._held_eos = b""
        self._first, self._strip_space = True, self._tok.add_space_prefix  # ready for a new stream
        return self._utf8.decode(rest, final=True)

    def _emit(self, raw: bytes) -> str:
        if not self._tok.clean_spaces:
            return self._utf8.decode(raw)
        self._unclean += raw
        cut = _clean_boundary(self._unclean)
        ready, self._unclean = self._unclean[:cut], self._unclean[cut:]
        return self._utf8.decode(clean_up_spaces(ready)) if ready else ""


# -- helpers -------------------------------------------------------------------------------------------
def _split_on_token(fragment: str, token: str, tid: int, attr: int, out: list[str | int]) -> None:
    """Replace each occurrence of ``token`` in ``fragment`` by ``tid``, stripping neighbours if asked."""
    pos = 0
    while True:
        at = fragment.find(token, pos)
        if at < 0:
            break
        left = fragment[pos:at]
        if attr & LSTRIP:
            left = left.rstrip(_C_SPACES)
        if left:
            out.append(left)
        out.append(tid)
        pos = at + len(token)
        if attr & RSTRIP:
            while pos < len(fragment) and fragment[pos] in _C_SPACES:
                pos += 1
    if pos < len(fragment):
        out.append(fragment[pos:])


def _bpe_merge(symbols: list[str], ranks: StringIndex) -> list[str]:
    """Apply merges lowest rank first, leftmost first among equals (llama.cpp's llm_tokenizer_bpe)."""
    n = len(symbols)
    if n < 2:
        return symbols
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    nxt[-1] = -1
    queue = []
    for i in range(n - 1):
        rank = ranks.get(symbols[i] + " " + symbols[i + 1])
        if rank is not None:
            queue.append((rank, i, i + 1, symbols[i] + symbols[i + 1]))
    heapq.heapify(queue)
    while queue:
        _, left, right, merged = heapq.heappop(queue)
        a, b = symbols[left], symbols[right]
        if not a or not b or a + b != merged:
            continue  # outdated by an earlier merge
        symbols[left], symbols[right] = merged, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        for l, r in ((prv[left], left), (left, nxt[left])):
            if l >= 0 and r >= 0:
                rank = ranks.get(symbols[l] + " " + symbols[r])
                if rank is not None:
                    heapq.heappush(queue, (rank, l, r, symbols[l] + symbols[r]))
    return [s for s in symbols if s]


def _spm_merge(symbols: list[str], token_to_id: StringIndex, scores: array.array) -> list[str]:
    """Merge the pair forming the highest-scoring token first, leftmost among equals (llama.cpp's SPM)."""
    n = len(symbols)
    if n < 2:
        return symbols
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    nxt[-1] = -1

    def pair(l: int, r: int) -> tuple | None:
        tid = token_to_id.get(symbols[l] + symbols[r])
        return None if tid is None else (-scores[tid], l, r, len(symbols[l]) + len(symbols[r]))

    queue = [entry for i in range(n - 1) if (entry := pair(i, i + 1))]
    heapq.heapify(queue)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        a, b = symbols[left], symbols[right]
        if not a or not b or len(a) + len(b) != size:
            continue  # outdated by an earlier merge
        symbols[left], symbols[right] = a + b, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        for l, r in ((prv[left], left), (left, nxt[left])):
            if l >= 0 and r >= 0 and (entry := pair(l, r)):
                heapq.heappush(queue, entry)
    return [s for s in symbols if s]


def _byte_level_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:  # what llama.cpp writes for a character outside the byte alphabet
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def _hex_prefix(digits: str) -> int:
    """strtol(digits, 16) as llama.cpp uses it on "<0xXX>" byte tokens: leading hex digits, else 0."""
    value = 0
    for ch in digits:
        if ch not in "0123456789abcdefABCDEF":
            break
        value = value * 16 + int(ch, 16)
    return value & 0xFF


_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_QUOTE_BETWEEN_SPACES = re.compile(rb" ' ")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")
_UNSAFE_FOR_CUT = re.compile(rb"[ ']")


def clean_up_spaces(raw: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: " ?" -> "?", " ' " -> "'", " 's" -> "'s" and the like."""
    raw = _SPACE_BEFORE_PUNCT.sub(b"", raw)
    raw = _QUOTE_BETWEEN_SPACES.sub(b"'", raw)
    return _SPACE_BEFORE_CONTRACTION.sub(b"", raw)


def _clean_boundary(raw: bytes) -> int:
    """The largest cut after which clean-up of the rest cannot affect what comes before: the three bytes
    before it hold no space or apostrophe (every clean-up pattern involves one of them next to the cut)."""
    for cut in range(len(raw), 2, -1):
        if not _UNSAFE_FOR_CUT.search(raw, cut - 3, cut):
            return cut
    return 0
