"""Split rules and flags for each ``tokenizer.ggml.pre`` value, as llama.cpp defines them (data only).

Each rule is a regex text exactly as llama.cpp writes it: some are recognised by their text and run by a
hand-written scanner (see ``engine.pretokenizer``), the others are run as ECMAScript regexes.
"""

from __future__ import annotations

import dataclasses

GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_SPACES = "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
LLAMA3 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" + _SPACES
LLAMA3_ORIGINAL = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" + _SPACES)
QWEN2 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" + _SPACES
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
_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_ASIAN_SCRIPTS = ("[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
                  "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
                  "\u1100-\u11ff]+")
_YOUTU_CJK = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
              "\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _KANA_HAN)

# Split rules per pre-tokenizer kind, in application order (llama.cpp's llm_tokenizer_bpe).
RULES: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+" + "".join(f"|\\s{{{n}}}(?!\\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
              + "|\\s{1,2}(?!\\S)|\\s{1}",),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
        "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
        "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
        "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
        "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
        "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
        "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
        "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-"
        "\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0"
        "-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", _CJK, "\\p{N}+"),
    "deepseek-v3": ("\\p{N}{1,3}", _KANA_HAN, _PUNCT_WORDS + "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    "spark2_5": ("\\p{N}{1,3}", _KANA_HAN, _PUNCT_WORDS + "|[\r\n]|\\s+(?!\\S)|\\s+", "\\p{N}"),
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
    "seed-coder": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                   + _SPACES,),
    "ufakzeka": ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" + _SPACES,),
    "afmoe": (DIGIT_GROUPS, _ASIAN_SCRIPTS,
              _PUNCT_WORDS.replace("\r\n", "\\r\\n") + "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    "laguna": (NEWLINE_RUNS, QWEN2),
    "exaone-moe": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "minicpm5": ("\\p{N}{1,3}", _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 + _SPACES),
    "youtu": (_YOUTU_CJK, _cased_classes("")),
}


@dataclasses.dataclass(frozen=True)
class Kind:
    """How one pre-tokenizer kind splits, and the vocabulary flags llama.cpp sets with it."""

    rules: str
    clean_spaces: bool = True  # llama.cpp's clean_up_tokenization_spaces default for BPE
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False


def _kinds() -> dict[str, Kind]:
    table: dict[str, Kind] = {}

    def add(names: str, rules: str, **flags) -> None:
        for name in names.split():
            table[name] = Kind(rules, **flags)

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
