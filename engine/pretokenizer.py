"""Pre-tokenization: split text into words exactly as llama.cpp does for each ``tokenizer.ggml.pre``.

llama.cpp applies a list of split rules in order, each one cutting every current piece further. A rule is
either one of its hand-written scanners (GPT-2, Llama 3, Qwen 2 families), selected by the exact regex text,
or an ECMAScript regex run on a "collapsed" copy of the text in which every non-ASCII code point is replaced
by one placeholder per Unicode class. We reproduce both, quirks included: \\p{Lu} means any letter, '~' is a
symbol but other ASCII classes are fixed, and non-ASCII whitespace only matches \\s.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from engine.pretokenizer_rules import (
    DIGIT_GROUPS, DIGIT_GROUPS_AYA, GPT2, KINDS, LLAMA3, LLAMA3_ORIGINAL, NEWLINE_RUNS, QWEN2, QWEN35, RULES,
)
from engine.unicode_classes import (
    CATEGORY_MASK, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE, class_table,
)

class PreTokenizer:
    """Splits text into words for one ``tokenizer.ggml.pre`` value (byte-level BPE vocabularies)."""

    def __init__(self, name: str):
        if name not in KINDS:
            raise KeyError(name)
        self.name = name
        kind = KINDS[name]
        self.clean_spaces, self.ignore_merges = kind.clean_spaces, kind.ignore_merges
        self.add_bos, self.no_bos = kind.add_bos, kind.no_bos
        self._rules = [_compile_rule(rule) for rule in RULES[kind.rules]]

    def split(self, text: str) -> list[str]:
        """Cut ``text`` into words; concatenating them gives ``text`` back."""
        if not text:
            return []
        codepoints = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        view = _TextView(text, codepoints)
        lengths = [len(codepoints)]
        for rule in self._rules:
            lengths = rule(view, lengths)
        words, start = [], 0
        for n in lengths:
            if n:
                words.append(text[start:start + n])
            start += n
        return words


class _TextView:
    """The text in the forms the rules need, each computed on first use."""

    def __init__(self, text: str, codepoints: np.ndarray):
        self.text, self._cps = text, codepoints
        self._classes = self._cp_list = self._class_list = self._collapsed = self._wide = None

    @property
    def classes(self) -> np.ndarray:
        if self._classes is None:
            self._classes = class_table()[self._cps]
        return self._classes

    def lists(self) -> tuple[list[int], list[int]]:
        if self._cp_list is None:
            self._cp_list, self._class_list = self._cps.tolist(), self.classes.tolist()
        return self._cp_list, self._class_list

    @property
    def collapsed(self) -> str:
        """One character per code point: ASCII kept, others replaced by their class placeholder."""
        if self._collapsed is None:
            placeholder = _PLACEHOLDER[self.classes & CATEGORY_MASK]
            placeholder[(self.classes & WHITESPACE) != 0] = 0x0B
            ascii_ = self._cps < 128
            placeholder[ascii_] = self._cps[ascii_]
            self._collapsed = placeholder.astype(np.uint8).tobytes().decode("latin-1")
        return self._collapsed

    @property
    def wide(self) -> str:
        """The text with non-ASCII whitespace turned into \\v, as llama.cpp feeds std::wregex."""
        if self._wide is None:
            odd_space = (self._cps > 0x7F) & ((self.classes & WHITESPACE) != 0)
            if odd_space.any():
                cps = self._cps.copy()
                cps[odd_space] = 0x0B
                self._wide = cps.tobytes().decode("utf-32-le", "surrogatepass")
            else:
                self._wide = self.text
        return self._wide


_PLACEHOLDER = np.full(256, 0xD0, dtype=np.uint32)
for _cls, _code in ((NUMBER, 0xD1), (LETTER, 0xD2), (PUNCTUATION, 0xD3), (MARK, 0xD4), (SYMBOL, 0xD5)):
    _PLACEHOLDER[_cls] = _code

# What each \p{...} becomes inside a character class of the collapsed regex.
_CLASS_SETS = {
    NUMBER: "\xd10-9", LETTER: "\xd2A-Za-z", PUNCTUATION: "\xd3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", MARK: "\xd4",
    SYMBOL: "\xd5\\$\\+<->^`\\|\\~",
}
_PROPERTIES = {"\\p{N}": NUMBER, "\\p{L}": LETTER, "\\p{P}": PUNCTUATION, "\\p{M}": MARK, "\\p{S}": SYMBOL,
               "\\p{Lu}": LETTER, "\\p{Ll}": LETTER, "\\p{Lt}": LETTER, "\\p{Lm}": LETTER, "\\p{Lo}": LETTER}


def _collapse_pattern(expr: str) -> str:
    """Rewrite \\p{...} into the placeholder classes, tracking [...] the way llama.cpp does."""
    out, inside, i = [], False, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append(ch)
            inside = True
        elif inside and ch == "]" and expr[i - 1] != "\\":
            out.append(ch)
            inside = False
        elif expr.startswith("\\p{", i) and i + 3 < len(expr):
            close = expr.find("}", i + 3)
            prop = expr[i:close + 1] if 0 <= close <= i + 10 else ""
            if prop in _PROPERTIES:
                members = _CLASS_SETS[_PROPERTIES[prop]]
                out.append(members if inside else f"[{members}]")
                i = close + 1
                continue
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _compile_rule(expr: str):
    """A function (view, lengths) -> lengths for one split rule."""
    custom = _CUSTOM.get(expr)
    if custom is not None:
        return lambda view, lengths: _run_scanner(custom, view, lengths)
    collapsed = any(prop in expr for prop in _PROPERTIES)
    pattern = _collapse_pattern(expr) if collapsed else expr
    if pattern.endswith("$"):  # ECMAScript '$' is end of input only; Python's also matches before a final \n
        pattern = pattern[:-1] + "\\Z"
    regex = re.compile(pattern, re.ASCII)  # \s, \d, \b as C's "C" locale sees them
    if collapsed:
        return lambda view, lengths: _regex_split(regex, view.collapsed, lengths)
    return lambda view, lengths: _regex_split(regex, view.wide, lengths)


def _regex_split(regex: re.Pattern, target: str, lengths: list[int]) -> list[int]:
    """Each piece becomes its matches and the gaps between them (std::regex_iterator semantics)."""
    out, start = [], 0
    for n in lengths:
        piece, done = target[start:start + n], 0
        for m in regex.finditer(piece):
            if m.start() > done:
                out.append(m.start() - done)
            out.append(m.end() - m.start())
            done = m.end()
        if done < n:
            out.append(n - done)
        start += n
    return out


def _run_scanner(scanner, view: _TextView, lengths: list[int]) -> list[int]:
    cps, classes = view.lists()
    out, start = [], 0
    for n in lengths:
        if n:
            # two sentinels past the end: class 0 stops every run, code point -1 matches nothing
            scanner(cps[start:start + n] + [-1, -1], classes[start:start + n] + [0, 0], n, out)
        start += n
    return out if out else lengths


# -- llama.cpp's hand-written scanners -------------------------------------------------------------------
_CR, _LF, _SPACE, _APOSTROPHE = 13, 10, 32, 39
_S, _T, _M, _D, _R, _E, _V, _L = (ord(ch) for ch in "stmdrevl")


def _contraction_end(cps: list[int], pos: int, n: int, fold_case: bool) -> int:
    """End of 's 't 're 've 'm 'll 'd starting at pos, or 0."""
    if cps[pos] != _APOSTROPHE or pos + 1 >= n:
        return 0
    a = cps[pos + 1]
    if fold_case and 65 <= a <= 90:
        a += 32
    if a in (_S, _T, _M, _D):
        return pos + 2
    if pos + 2 < n:
        b = cps[pos + 2]
        if fold_case and 65 <= b <= 90:
            b += 32
        if (a == _R and b == _E) or (a == _V and b == _E) or (a == _L and b == _L):
            return pos + 3
    return 0


def _scan_gpt2(cps: list[int], cls: list[int], n: int, out: list[int]) -> None:
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    pos = 0
    while pos < n:
        start, cp, here = pos, cps[pos], cls[pos]
        end = _contraction_end(cps, pos, n, False)
        ahead = cls[pos + 1] if cp == _SPACE else here
        if end:
            pos = end
        elif ahead & (LETTER | NUMBER):
            run = LETTER if ahead & LETTER else NUMBER
            pos += cp == _SPACE
            while cls[pos] & run:
                pos += 1
        elif ahead and not ahead & (WHITESPACE | LETTER | NUMBER):
            pos += cp == _SPACE
            while cls[pos] and not cls[pos] & (WHITESPACE | LETTER | NUMBER):
                pos += 1
        else:
            pos = _whitespace_end(cps, cls, pos, n, stop_at_newline=False)
        out.append(pos - start)


def _whitespace_end(cps: list[int], cls: list[int], pos: int, n: int, stop_at_newline: bool) -> int:
    """\\s*[\\r\\n]+ (when asked) | \\s+(?!\\S) | \\s+ | any single character."""
    count, after_newline = 0, 0
    while cls[pos + count] & WHITESPACE:
        if cps[pos + count] in (_CR, _LF):
            after_newline = pos + count + 1
        count += 1
    if stop_at_newline and after_newline:
        return after_newline
    if count > 1 and pos + count < n:
        return pos + count - 1
    return pos + max(count, 1)


def _scan_llama3_family(cps: list[int], cls: list[int], n: int, out: list[int], *, max_digits: int,
                        word: int) -> None:
    """Llama 3 (digits in threes), Qwen 2 (single digits) and Qwen 3.5 (marks join letters) word splitting."""
    stop = WHITESPACE | NUMBER | word
    pos = 0
    while pos < n:
        start, cp, here = pos, cps[pos], cls[pos]
        end = _contraction_end(cps, pos, n, True)
        if end:
            pos = end
        elif not (cp == _CR or cp == _LF or here & NUMBER) and (here | cls[pos + 1]) & word:
            pos += 1
            while cls[pos] & word:
                pos += 1
        elif here & NUMBER:
            while cls[pos] & NUMBER and pos - start < max_digits:
                pos += 1
        elif not (cls[pos + 1] if cp == _SPACE else here) & stop:
            pos += cp == _SPACE
            while cls[pos] and not cls[pos] & stop:
                pos += 1
            while cps[pos] == _CR or cps[pos] == _LF:
                pos += 1
        else:
            pos = _whitespace_end(cps, cls, pos, n, stop_at_newline=True)
        out.append(pos - start)


def _scan_digit_groups(cps: list[int], cls: list[int], n: int, out: list[int]) -> None:
    """Digit runs cut so that every group but the first has three digits; what precedes a run joins its
    first group (as in llama.cpp)."""
    done = pos = 0
    while pos < n:
        if not cls[pos] & NUMBER:
            pos += 1
            continue
        run_start = pos
        while cls[pos] & NUMBER:
            pos += 1
        cut = run_start + (pos - run_start) % 3
        cuts = ([cut] if cut > run_start else []) + list(range(cut + 3, pos + 1, 3))
        for end in cuts:
            out.append(end - done)
            done = end
    if done < n:
        out.append(n - done)


def _scan_newline_runs(cps: list[int], cls: list[int], n: int, out: list[int]) -> None:
    """[^\\n]+|[\\n]+"""
    pos = 0
    while pos < n:
        start, newline = pos, cps[pos] == _LF
        while pos < n and (cps[pos] == _LF) == newline:
            pos += 1
        out.append(pos - start)


_CUSTOM = {
    GPT2: _scan_gpt2,
    LLAMA3: functools.partial(_scan_llama3_family, max_digits=3, word=LETTER),
    LLAMA3_ORIGINAL: functools.partial(_scan_llama3_family, max_digits=3, word=LETTER),
    QWEN2: functools.partial(_scan_llama3_family, max_digits=1, word=LETTER),
    QWEN35: functools.partial(_scan_llama3_family, max_digits=1, word=LETTER | MARK),
    NEWLINE_RUNS: _scan_newline_runs,
    DIGIT_GROUPS: _scan_digit_groups,
    DIGIT_GROUPS_AYA: _scan_digit_groups,
}
