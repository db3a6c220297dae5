"""Pre-tokenization: split text into words exactly as llama.cpp does for each ``tokenizer.ggml.pre``.

llama.cpp applies a list of split rules in order, each one cutting every current piece further. A rule is
either one of its hand-written scanners (GPT-2, Llama 3, Qwen 2 families), selected by the exact regex text,
or an ECMAScript regex run on a "collapsed" copy of the text in which every non-ASCII code point is replaced
by one placeholder per Unicode class. We reproduce both, quirks included: \\p{Lu} means any letter, '~' is a
symbol but other ASCII classes are fixed, and non-ASCII whitespace only matches \\s.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from engine.unicode_classes import (
    CATEGORY_MASK, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE, class_table,
)

GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
LLAMA3_ORIGINAL = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
NEWLINE_RUNS = "[^\\n]+|[\\n]+"
DIGIT_GROUPS = "\\p{AFMoE_digits}"
DIGIT_GROUPS_AYA = "\\d{1,3}(?=(?:\\d{3})*\\b)"

def _cased_lookahead(word: str, contraction: str, digits: str) -> str:
    """Tekken / GPT-4o words; llama.cpp emulates \\p{Lu}/\\p{Ll} runs with lookaheads over [^a-z] / [^A-Z]."""
    upper, lower = f"((?=[{word}])([^a-z]))", f"((?=[{word}])([^A-Z]))"
    lead = "[^\\r\\n\\p{L}\\p{N}]?"
    return (lead + upper + "*" + lower + "+" + contraction + "|" + lead + upper + "+" + lower + "*" + contraction
            + "|\\p{N}" + digits + "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def _cased_classes(digits: str) -> str:
    """Tiny Aya / Youtu words written with letter sub-classes (all of which llama.cpp reads as \\p{L})."""
    upper, lower = "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]", "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
    lead, tail = "[^\\r\\n\\p{L}\\p{N}]?", _CONTRACTIONS + "?"
    return (lead + upper + "*" + lower + "+" + tail + "|" + lead + upper + "+" + lower + "*" + tail
            + "|\\p{N}" + digits + "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


_PUNCT_WORDS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                "| ?[\\p{P}\\p{S}]+")
_FINNISH = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

# Split rules per pre-tokenizer kind, in application order (llama.cpp's llm_tokenizer_bpe).
_RULES: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
              + "".join(f"|\\s{{{n}}}(?!\\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + "|\\s{1,2}(?!\\S)|\\s{1}",),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", _CJK, "\\p{N}+"),
    "deepseek-v3": ("\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _PUNCT_WORDS + "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    "spark2_5": ("\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _PUNCT_WORDS + "|[\r\n]|\\s+(?!\\S)|\\s+", "\\p{N}"),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
    "falcon": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "starcoder": ("\\p{N}", GPT2),
    "gpt2": (GPT2,),
    "qwen2": (QWEN2,),
    "qwen35": (QWEN35,),
    "poro": (_FINNISH,),
    "viking": (_FINNISH, "\\p{N}"),
    "tekken": (_cased_lookahead("\\p{L}", "", ""),),
    "gpt-4o": (_cased_lookahead("\\p{L}", _CONTRACTIONS + "?", "{1,3}"),),
    "granite-embed-multi-97m": (_cased_lookahead("\\p{L}\\p{M}", _CONTRACTIONS + "?", "{1,3}"),),
    "tiny_aya": (DIGIT_GROUPS_AYA, _cased_classes("{1,3}")),
    "superbpe": ("\\p{N}+", "(?=(\\d{3})+(?!\\d))"),
    "bailingmoe": ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "seed-coder": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
                   "|\\s+(?!\\S)|\\s+",),
    "ufakzeka": ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "afmoe": (DIGIT_GROUPS, "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
              _PUNCT_WORDS.replace("\r\n", "\\r\\n") + "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    "laguna": (NEWLINE_RUNS, QWEN2),
    "exaone-moe": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "minicpm5": ("\\p{N}{1,3}", _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
}
_RULES["youtu"] = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _cased_classes(""))


@dataclasses.dataclass(frozen=True)
class _Kind:
    rules: str
    clean_spaces: bool = True  # llama.cpp's clean_up_tokenization_spaces default for BPE
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False


def _kinds() -> dict[str, _Kind]:
    table: dict[str, _Kind] = {}

    def add(names: str, rules: str, **flags) -> None:
        for name in names.split():
            table[name] = _Kind(rules, **flags)

    add("default", "default")
    add("minicpm5", "minicpm5", ignore_merges=True)
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", "llama3",
        ignore_merges=True, add_bos=True)
    add("deepseek-llm", "deepseek-llm", clean_spaces=False)
    add("deepseek-coder", "deepseek-coder", clean_spaces=False)
    add("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", "deepseek-v3", clean_spaces=False)
    add("spark2_5", "spark2_5", clean_spaces=False)
    add("youtu", "youtu", clean_spaces=False, ignore_merges=True)
    add("falcon", "falcon")
    add("starcoder refact codeshell exaone minerva-7b mellum2", "starcoder")
    add("command-r smollm", "starcoder", clean_spaces=False)
    add("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4 mpt olmo jais"
        " jina-v1-en jina-v2-code roberta-bpe", "gpt2")
    add("trillion granite-docling", "gpt2", clean_spaces=False)
    add("jais-2", "jais2")
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", "qwen2", clean_spaces=False)
    add("stablelm2 megrez", "qwen2")
    add("qwen35", "qwen35", clean_spaces=False)
    add("dbrx smaug-bpe", "llama3")
    add("chatglm-bpe", "llama3", no_bos=True)
    add("glm4 glm5", "llama3", no_bos=True, ignore_merges=True)
    add("poro-chat", "poro", clean_spaces=False)
    add("bloom gpt3-finnish", "poro")
    add("viking", "viking", clean_spaces=False)
    add("tekken", "tekken", clean_spaces=False, ignore_merges=True, add_bos=True)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", "gpt-4o", clean_spaces=False)
    add("granite-embed-multi-97m", "granite-embed-multi-97m", clean_spaces=False, ignore_merges=True)
    add("tiny_aya cohere2moe", "tiny_aya", clean_spaces=False)
    add("superbpe", "superbpe", clean_spaces=False)
    add("bailingmoe bailingmoe2 llada-moe", "bailingmoe", clean_spaces=False)
    add("seed-coder", "seed-coder", clean_spaces=False)
    add("ufakzeka", "ufakzeka", clean_spaces=False)
    add("grok-2", "qwen2", clean_spaces=False)
    add("afmoe", "afmoe", clean_spaces=False)
    add("laguna", "laguna", clean_spaces=False)
    add("exaone-moe", "exaone-moe")
    return table


KINDS = _kinds()


class PreTokenizer:
    """Splits text into words for one ``tokenizer.ggml.pre`` value (byte-level BPE vocabularies)."""

    def __init__(self, name: str):
        if name not in KINDS:
            raise KeyError(name)
        self.name = name
        kind = KINDS[name]
        self.clean_spaces, self.ignore_merges = kind.clean_spaces, kind.ignore_merges
        self.add_bos, self.no_bos = kind.add_bos, kind.no_bos
        self._rules = [_compile_rule(rule) for rule in _RULES[kind.rules]]

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
