"""Generate extra_tokenize_<model>.json: llama.cpp token ids for hard tokenizer inputs (developer tool).

Run once with llama-cpp-python installed (the tests only read the JSON):

    python -m tests.reference.make_extra_tokenize            # all three test models
    python -m tests.reference.make_extra_tokenize gemma3     # one model

Fields of each case, all from llama.cpp through llama-cpp-python (vocab only):
  ids             Llama.tokenize(text, add_bos=True,  special=False)   (add_special=True, parse_special=False)
  ids_special     Llama.tokenize(text, add_bos=True,  special=True)
  detok_roundtrip llama_detokenize(Llama.tokenize(text, add_bos=False, special=False), remove_special=False,
                  unparse_special=False): what Llama.detokenize returns, except that Llama.detokenize cuts
                  pieces longer than 32 bytes (e.g. Qwen's 32-space token) to nothing
  detok_special   llama_detokenize(ids_special, remove_special=False, unparse_special=True)
  detok_skip      llama_detokenize(ids_special, remove_special=True,  unparse_special=False)
The header also records llama.cpp's n_vocab, bos_id, eos_id, add_bos, add_eos and end-of-generation ids.
Decoded bytes that are not valid UTF-8 are stored with U+FFFD, as Tokenizer.decode returns them.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

from tests.model_store import MODELS, model_path

HERE = Path(__file__).parent

_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog; 3.14159 and 2,718,281 are numbers.\n"
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
    "Привет, мир! مرحبا بالعالم. नमस्ते दुनिया। 안녕하세요 세계. สวัสดีชาวโลก 日本語と中文。\n"
    "Emoji: 👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈 — “quotes”, ‘single’, don't, WE'LL, it's.\t\tTabs\tand   spaces   \n"
)

CASES: list[tuple[str, str]] = [
    ("arabic", "مرحبا بالعالم! هذه جملة عربية للاختبار، وتحتوي على أرقام ٣٤٥ و 678 وعلامات ترقيم؟"),
    ("hindi", "नमस्ते दुनिया! यह एक परीक्षण वाक्य है। संख्याएँ: १२३ और 456, और विराम-चिह्न।"),
    ("korean", "안녕하세요, 세계! 한국어 문장을 토큰화합니다. 숫자 2024년 3월 15일, 영어 mixed 단어."),
    ("russian", "Съешь же ещё этих мягких французских булок, да выпей чаю. ЁЛКИ-палки! 1917 год."),
    ("thai", "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ตัวเลข ๑๒๓ และ 456 ครับ"),
    ("mixed_scripts", "English, Ελληνικά, עברית, ქართული, Հայերեն, ᏣᎳᎩ, ⠓⠑⠇⠇⠕, 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 and ﬁﬂ ligatures"),
    ("combining_marks", "e\u0301 a\u0300\u0323 n\u0303o Z\u0351\u0308\u0351a\u0360\u035dl\u0334g\u0358o\u035f i\u0307 \u0915\u094d\u0937"),
    ("python", "import os\n\n\nclass Foo(Bar):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self, x=1, *args, **kw):\n"
               "        self.x = x  # comment\n        if x >= 10 and not kw:\n            raise ValueError(f'bad {x!r}')\n"),
    ("javascript", "const add = (a, b) => a + b;\nexport default async function main() {\n\tawait fetch(`/api/${id}?q=1&r=2`);\n"
                   "\treturn [...xs].map(x => x ** 2).filter(Boolean) ?? null;\n}\n"),
    ("rust", "fn main() -> Result<(), Box<dyn std::error::Error>> {\n    let v: Vec<u8> = vec![0x1F, 0b1010, 255];\n"
             "    println!(\"{:?} {}\", v, v.len());\n    Ok(())\n}\n"),
    ("c_and_sql", "#include <stdio.h>\nint main(void){for(int i=0;i<10;++i){printf(\"%d\\n\",i);}return 0;}\n"
                  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%o''brien%' ORDER BY id DESC;\n"),
    ("html_json_yaml", "<div class=\"a\"><p>Hi &amp; bye</p></div>\n{\"key\": [1, 2.5, -3e10, true, null], \"k2\": \"v\"}\n"
                       "items:\n  - name: x\n    value: 1\n  - name: y\n"),
    ("emoji_zwj_skin", "👨‍👩‍👧‍👦 👩🏽‍💻 🧑🏿‍🚀 👍🏻👍🏼👍🏽👍🏾👍🏿 🏳️‍🌈 🏴‍☠️ ❤️‍🔥 🇯🇵🇺🇸 1️⃣ #️⃣ 🫶🏾 🩷 🫨 👁️‍🗨️"),
    ("emoji_dense", "🙂🚀🎉🔥💯✨🥲🤖🦀🐍" * 3),
    ("spaces_runs", " a  b   c    d     e      f       g        h         i" + " " * 17 + "j" + " " * 33 + "k   "),
    ("only_spaces", " " * 40),
    ("newline_runs", "a\nb\n\nc\n\n\nd\n\n\n\ne" + "\n" * 12 + "f\n \n  \n\t\n" + "\n" * 5),
    ("tabs", "\tone\t\ttwo\t\t\tthree" + "\t" * 9 + "end\t \t"),
    ("crlf_and_odd_spaces", "line\r\nnext\r\n\r\nthird\rfourth\u00a0nbsp\u2003em\u3000ideo\u2028sep\u0085nel \u200bzw"),
    ("numbers", " ".join(str(7 ** k) for k in range(1, 24)) + " 0 00 007 -42 +3.5e-7 1,234,567.890 0x1F 1e100"),
    ("digit_strings", "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 12345678901234567890"),
    ("dates_versions", "2024-01-31T12:34:56Z v1.2.3-rc.4 192.168.0.1:8080 +1 (555) 123-4567 3/4 ½ ²³ ٣٤٥ ０１２"),
    ("punctuation", "!!! ??? ... --- ___ *** ### @@ $$ %% ^^ && || ~~ `` '' \"\" <<>> [[]] {{}} (()) ;; :: ,, ¿¡ «» „“ 、。"),
    ("contractions", "I'm you're he's she'd we'll they've it'd DON'T WON'T I'M 'S 'T 'Re 'vE 'lL y'all o'clock '90s"),
    ("specials_chatml", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi <|im_end|><|im_start|>assistant\n"),
    ("specials_gemma", "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn><eos>"),
    ("specials_mixed", "<|endoftext|> </s> <s> <unk> <pad> <mask> <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|> "
                       "<tool_call>{\"a\":1}</tool_call> <start_of_image> [multimodal] <|im_end|x <|im_start <end_of_turn"),
    ("specials_adjacent", "<|im_end|><|im_end|><end_of_turn><end_of_turn>  <|im_start|>  \n<eos>\n\n<bos>"),
    ("control_chars", "nul\x00 bel\x07 esc\x1b del\x7f bom\ufeff pua\ue000 nonchar\ufdd0 tag\U000e0041 max\U0010fffd"),
    ("rare_cjk", "𠀀𠀁𪚥𰻞 龘 齉 㐀 〇 〆 ゟ ヿ ㈱ ㍻ ＡＢＣ ｶﾀｶﾅ"),
    ("math_symbols", "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑_{i=1}^{n} i = n(n+1)/2; ∫₀^∞ e^{-x} dx = 1; ≈≠≤≥±∞"),
    ("urls_paths", "https://example.com/a/b?c=d&e=f#g C:\\Users\\me\\file.txt ~/.config/app/settings.json user@mail.org"),
    ("long_20k", (_PARAGRAPH * 70)[:20480]),
]


class _LlamaCpp:
    """llama.cpp's vocabulary through llama-cpp-python."""

    def __init__(self, path: Path):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> str:
        lc = self.llama_cpp
        tokens = (lc.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_detokenize(self.vocab, tokens, len(ids), buf, size, remove_special, unparse_special)
        assert n >= 0, "detokenize buffer too small"
        return buf.raw[:n].decode("utf-8", "replace")

    def vocab_facts(self) -> dict:
        lc, vocab = self.llama_cpp, self.vocab
        n_vocab = lc.llama_vocab_n_tokens(vocab)
        return {
            "n_vocab": n_vocab,
            "bos_id": lc.llama_vocab_bos(vocab),
            "eos_id": lc.llama_vocab_eos(vocab),
            "add_bos": bool(lc.llama_vocab_get_add_bos(vocab)),
            "add_eos": bool(lc.llama_vocab_get_add_eos(vocab)),
            "eog_ids": [i for i in range(n_vocab) if lc.llama_vocab_is_eog(vocab, i)],
        }

    def case(self, name: str, text: str) -> dict:
        raw = text.encode("utf-8")
        ids_special = self.llm.tokenize(raw, add_bos=True, special=True)
        plain = self.llm.tokenize(raw, add_bos=False, special=False)
        return {
            "name": name,
            "text": text,
            "ids": self.llm.tokenize(raw, add_bos=True, special=False),
            "ids_special": ids_special,
            "detok_roundtrip": self.detokenize(plain, False, False),
            "detok_special": self.detokenize(ids_special, False, True),
            "detok_skip": self.detokenize(ids_special, True, False),
        }


def generate(name: str) -> Path:
    import llama_cpp

    lc = _LlamaCpp(model_path(name))
    header = {
        "model": MODELS[name].filename,
        "sha256": MODELS[name].sha256,
        "generator": f"tests/reference/make_extra_tokenize.py with llama-cpp-python {llama_cpp.__version__}",
        **lc.vocab_facts(),
    }
    cases = [json.dumps(lc.case(case_name, text), ensure_ascii=False) for case_name, text in CASES]
    head = json.dumps(header, ensure_ascii=False, indent=1)[:-2]  # one case per line keeps diffs readable
    out = HERE / f"extra_tokenize_{name}.json"
    out.write_text(head + ',\n "cases": [\n  ' + ",\n  ".join(cases) + "\n ]\n}\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    for model in sys.argv[1:] or list(MODELS):
        print(generate(model))
