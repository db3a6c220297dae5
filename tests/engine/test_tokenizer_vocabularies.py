"""Hearth's tokenizer on llama.cpp's own test vocabularies: every ``.inp``/``.out`` case, tricky strings checked
against llama.cpp itself (through llama-cpp-python), and the ``tokenizer.ggml.pre`` values of today's model families.

Vocabularies of tokenizer types Hearth does not implement are out of scope and named in ``OUT_OF_SCOPE``:
WPM (``bert-bge``), UGM (``nomic-bert-moe``, model ``t5``) and Gemma 4's own ``gemma4`` model type.
"""

from __future__ import annotations

import ctypes
import functools

import pytest

from engine.gguf_file import ModelFormatError, read_gguf
from engine.pretokenizer_rules import KINDS
from engine.tokenizer import Tokenizer
from engine.vocab import load_vocab
from tests.llama_cpp_sources import llama_cpp_tree, vocab_file

CASE_SEPARATOR = "\n__ggml_vocab_test__\n"  # as tests/test-tokenizer-0.cpp splits the .inp file
OUT_OF_SCOPE = {"bert-bge": "bert", "nomic-bert-moe": "t5", "gemma-4": "gemma4"}  # name: tokenizer model
# Vocabularies with cases whose tokenizer Hearth implements (BPE "gpt2" and SentencePiece "llama").
WITH_CASES = ("command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "llama-bpe", "llama-spm", "mpt",
              "phi-3", "qwen2", "qwen35", "refact", "starcoder")
# tokenizer.ggml.pre of real GGUF files of the families Hearth runs (SPM files, gemma2 and Phi-3.5, carry none).
FAMILY_PRE = {
    "qwen3": "qwen2", "qwen35": "qwen35", "llama 3.x": "llama-bpe", "smollm3": "llama-bpe",
    "mistral3 (Mistral Small 3.x, Ministral 3)": "tekken", "phi-4-mini": "gpt-4o", "gpt-oss": "gpt-4o",
    "granite 3.x": "refact", "granite 4.x": "dbrx", "olmo2": "dbrx", "smollm (1, 2)": "smollm",
}
TRICKY = (
    "def f(x):\n\treturn x**2  # square\n", "if (a != b) { return &x[0]; }", "    indented\n        twice\n",
    "🦙🔥👍🏽 emoji 👨\u200d👩\u200d👧", "中文分词测试，日本語のテキスト、한국어", "3.14159 1,000,000 12345678901234567890",
    "   leading and trailing   ", "\n\n\n\t\t  \r\n", "<|im_start|>user\nhi<|im_end|>", "<s>[INST] hello [/INST]</s>",
    "<think>\nreasoning\n</think>\n\nAnswer", "Ünïcödé ÀÉÎ naïve café", "ﬁ ligature ｆｕｌｌｗｉｄｔｈ",
    "x" * 300, "don't I'LL WE'VE they're", "<|endoftext|><|eot_id|><start_of_turn>", "a\u0301e\u0300 marks",
)


def _cases(name: str) -> list[tuple[str, list[int]]]:
    path = vocab_file(name)
    raw = path.with_name(path.name + ".inp").read_bytes().decode("utf-8")
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    inputs = raw.split(CASE_SEPARATOR)
    if inputs and inputs[-1] == "" and raw.endswith(CASE_SEPARATOR):  # the C++ reader stops at the end
        inputs.pop()
    outputs = [[int(t) for t in line.split()] for line in lines[:len(inputs)]]
    assert len(inputs) == len(outputs) > 20, name
    return list(zip(inputs, outputs))


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(read_gguf(vocab_file(name)))


@pytest.fixture(scope="module")
def llamas():
    """llama.cpp vocab-only models by vocabulary name, closed at the end (not left to interpreter shutdown)."""
    import llama_cpp
    opened: dict = {}

    def get(name: str):
        if name not in opened:
            opened[name] = llama_cpp.Llama(model_path=str(vocab_file(name)), vocab_only=True, verbose=False)
        return opened[name]

    yield get
    for llama in opened.values():
        llama.close()


def _llama_detokenize(llama, ids: list[int]) -> str:
    """llama.cpp's llama_detokenize (not the per-piece join ``Llama.detokenize`` does)."""
    import llama_cpp
    model = llama._model
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    buffer = ctypes.create_string_buffer(64 * len(ids) + 64)
    n = llama_cpp.llama_detokenize(model.vocab, tokens, len(ids), buffer, len(buffer), False, True)
    assert n >= 0
    return buffer.raw[:n].decode("utf-8", "replace")


def test_every_vocabulary_is_covered_or_named_out_of_scope() -> None:
    names = {p.name[len("ggml-vocab-"):-len(".gguf")] for p in (llama_cpp_tree() / "models").glob("ggml-vocab-*.gguf")}
    with_cases = {n for n in names if vocab_file(n).with_name(vocab_file(n).name + ".inp").exists()}
    assert with_cases - set(OUT_OF_SCOPE) == set(WITH_CASES)


@pytest.mark.parametrize("name", WITH_CASES)
def test_llama_cpp_vocabulary_cases_match_exactly(name: str) -> None:
    tok = _tokenizer(name)
    failures = [(text, tok.encode(text, add_special=False), ids) for text, ids in _cases(name)
                if tok.encode(text, add_special=False) != ids]
    assert not failures, failures[:3]


@pytest.mark.parametrize("name,model", sorted(OUT_OF_SCOPE.items()))
def test_out_of_scope_vocabularies_are_refused_by_name(name: str, model: str) -> None:
    with pytest.raises(ModelFormatError, match=f"unsupported tokenizer model '{model}'"):
        _tokenizer(name)


@pytest.mark.parametrize("name", ("qwen2", "qwen35", "phi-3", "llama-bpe", "llama-spm", "refact", "gpt-2"))
@pytest.mark.parametrize("parse_special", (False, True))
def test_tricky_strings_match_llama_cpp(name: str, parse_special: bool, llamas) -> None:
    tok, llama = _tokenizer(name), llamas(name)
    for text in TRICKY:
        for add_special in (False, True):
            expected = llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
            assert tok.encode(text, add_special=add_special, parse_special=parse_special) == expected, text
        ids = tok.encode(text, add_special=False, parse_special=parse_special)
        assert tok.decode(ids) == _llama_detokenize(llama, ids), text


@pytest.mark.parametrize("family,pre", sorted(FAMILY_PRE.items()))
def test_family_pretokenizers_are_known(family: str, pre: str) -> None:
    assert pre in KINDS, family


def test_unknown_pretokenizer_is_refused_by_name() -> None:
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
                "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(ModelFormatError, match="'no-such-pre'"):
        load_vocab(metadata)
