"""Write tests/fixtures/tokenizer_llamacpp.json: llama.cpp's token ids for >= 2,000 varied strings (and, with
--model gemma3-270m, tests/fixtures/tokenizer_gemma3_llamacpp.json: the same kind of strings for Gemma 3's
SentencePiece-style tokenizer, fewer of them, plus its own control and user-defined tokens).

llama.cpp is our reference tokenizer (transformers' GGUF tokenizer lacks the split of every digit on its own).
The strings are generated deterministically (seeded): accented Latin, CJK, Cyrillic, Arabic, emoji (skin tones, flags,
ZWJ sequences), numbers, whitespace runs, code, contractions, control-token text (tokenized with special=False and
special=True) and mixtures of all of these. tests/test_tokenizer.py checks that our tokenizer gives the same ids.

Rerun (needs the `peers` extra, which compiles llama.cpp):

    pip install -e '.[peers]'
    python scripts/make_tokenizer_fixture.py                # default model
    python scripts/make_tokenizer_fixture.py --model gemma3-270m
    python scripts/make_tokenizer_fixture.py --model PATH   # another GGUF (then the test needs that model too)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20241130
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
OUT = FIXTURES / "tokenizer_llamacpp.json"
GEMMA_OUT = FIXTURES / "tokenizer_gemma3_llamacpp.json"
GEMMA_COUNT = 1500         # of the generated strings (a 262k vocabulary: a larger file per string)
# Gemma 3's control tokens and a sample of its user-defined ones (whitespace runs, HTML tags), alone and in text.
GEMMA_SPECIAL = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<unused0>",
                 "<unused6241>", "[multimodal]", "<start_of_image>", "<end_of_image>", "<table>", "</td>", "<h1>",
                 "<strong>", "<s>", "</s>", "<a>", "<div>", "</footer>", "\n\n\n", "  ", "\t\t", " " * 40, "\n" * 33]
GEMMA_HAND_WRITTEN = [
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nhi<end_of_turn>", "text<end_of_turn>text", " <eos> ", "<eos><eos>", "<<bos>>",
    "<start_of_turn", "end_of_turn>", "<table><tr><td>1</td></tr></table>", "a  b   c    d", "x\n\ny\n\n\nz",
    "\t\tindented\n    four", "<unused12>x<unused13>", "▁already▁escaped", "▁", " ▁ ", "\x01\x02\x7f",
    "\U00040000", "\ufeff", "\u200d", "a\u0301", "ＡＢＣ", "ﬁ", "Hello world", " Hello", "The capital of France is",
]

CONTROL_TEXTS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                 "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
                 "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"]

WORDS = {
    "latin": ["hello", "world", "The", "quick", "brown", "fox", "naïve", "café", "résumé", "Ångström", "straße",
              "Größe", "señor", "niño", "façade", "œuvre", "Dvořák", "Łódź", "İstanbul", "ÉCOLE", "coöperate", "ﬁne"],
    "cjk": ["日本語", "中文", "漢字", "東京タワー", "ひらがな", "カタカナ", "한국어", "안녕하세요", "你好，世界",
            "「引用」", "。"],
    "cyrillic": ["Привет", "мир", "Москва", "ёлка", "Україна", "ЖЖЖ", "съешь"],
    "arabic": ["مرحبا", "بالعالم", "العربية", "٣٤٥", "سلام"],
    "other_scripts": ["Γειά", "σου", "नमस्ते", "שלום", "ภาษาไทย", "ሰላም", "Ꭳ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ℕ", "Ⅻ"],
    "emoji": ["😀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "🏳️‍🌈", "❤️", "✨", "🤷🏻‍♀️", "1️⃣", "🫠", "🧑🏿‍🚀"],
    "apostrophe": ["it's", "I'll", "don't", "you're", "we've", "I'm", "he'd", "IT'S", "I'LL", "DON'T", "it’s",
                   "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "''", "'", "rock'n'roll", "'quoted'"],
    "punct": ["!", "?", "...", "--", "—", "«", "»", "(", ")", "[", "]", "{", "}", "@", "#", "$", "%", "^", "&", "*",
              "->", "=>", "!=", "<=", "::", ";", "~", "`", "|", "\\", "/", "_", "__init__", "¿", "¡", "§", "€", "©"],
    "control": CONTROL_TEXTS + ["<|im_start|>user\nhi<|im_end|>", "<|im_start", "im_end|>", "<|", "|>", "< |im_end| >"],
}

CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "if x == 1:\n        print('one')\n    else:\n        pass",
    "const y = await fetch(`/api/${id}`);",
    "SELECT * FROM users WHERE id = 42;",
    "#include <stdio.h>\nint main(void) { return 0; }\n",
    "x = [i**2 for i in range(10)]  # squares",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "{\"key\": [1, 2.5, -3e10, null, true]}",
    "<div class=\"a\">&nbsp;</div>",
    "    \n\n    indented\n\t\tmore",
    "a_b = c->d; e::f(g);",
]

WHITESPACE = [" ", "  ", "   ", "        ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\n\n\n", " \n", "\n ", " \t ",
              "\u00a0", "\u3000", "\u2009", "\u200b", "\x0b", "\x0c", "\u2028", "\u0085", " \n\t \r\n  "]


def number(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 999)},{rng.randrange(1000):03d},{rng.randrange(1000):03d}"
    if kind == 3:
        return "x" + " " * rng.randrange(1, 4) + str(rng.randrange(100))
    if kind == 4:
        return f"{rng.random():.3e}"
    if kind == 5:
        return rng.choice(["²", "½", "³⁄₄", "１２３", "٣٤", "४२", "Ⅻ", "⑦", "𝟙𝟚"])
    if kind == 6:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    return f"v{rng.randrange(10)}.{rng.randrange(20)}.{rng.randrange(100)}"


def random_codepoints(rng: random.Random, n: int) -> str:
    """Random characters, mostly from common blocks, sometimes any code point but a surrogate."""
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F), (0x2000, 0x206F),
              (0x2100, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1F64F),
              (0, 0xD7FF), (0xE000, 0x10FFFF)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def fragment(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(WORDS[rng.choice(list(WORDS))])
    if r < 0.6:
        return number(rng)
    if r < 0.72:
        return rng.choice(WHITESPACE)
    if r < 0.8:
        return rng.choice(CODE)
    if r < 0.9:
        return random_codepoints(rng, rng.randrange(1, 12))
    return "".join(rng.choice(WHITESPACE + ["a", "1", "'", "s"]) for _ in range(rng.randrange(1, 8)))


def mixture(rng: random.Random, max_parts: int = 8) -> str:
    parts = [fragment(rng) for _ in range(rng.randrange(1, max_parts + 1))]
    seps = ["", " ", " ", "  ", "\n", "\t"]
    return "".join(p + rng.choice(seps) for p in parts)


HAND_WRITTEN = [
    "", " ", "a", "Hello world", "Hello, world!", " Hello", "  Hello", "Hello ", "Hello  ", "x  1", "x 1", "x1",
    "2024", " 2024", "3.14159", "1,000,000", "-42", "1e-5", "0x1F", "007", "The year 2024 was great!",
    "I'll", "it's", "IT'S", "it’s", "you're we've I'm he'd can't", "'s'll", "'", "''s", " 's",
    "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "a\n\nb", "a \n b", "a\t\tb", "a   b", "end   ", "\u00a0a",
    "日本語のテキスト", "Привет, мир!", "مرحبا بالعالم", "café naïve résumé", "😀😀😀", "👍🏽", "👨‍👩‍👧‍👦",
    "🇫🇷🇩🇪", "🏳️‍🌈", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>text", " <|im_end|> ", "<|im_end|><|im_end|>", "<|im_end|\n>", "<<|im_end|>>",
    "<|endoftext|><|im_start|>", "<repo_name>x<file_sep>y", "<jupyter_code>print(1)<jupyter_output>1",
    # bytes the vocabulary has no token for (6 ASCII controls; lead byte 0xF1 of planes 4-7): llama.cpp drops them
    "a\x1db", "\x04\x06\x13\x14\x16", " \x1d ", "x\U00040000y", "\x00", "a\x00b\x7f",
    # letters and digits newer than llama.cpp's Unicode 15.1 tables count as symbols there
    "a\u0c5c's", "\U00013460's", "x\U000323B0y", " \U00011BF01", "\uA7CBb", "𮯠's", "\U0002EBF0's",
]


def generate_strings() -> list[tuple[str, bool]]:
    """(text, special) pairs, deterministic for SEED."""
    rng = random.Random(SEED)
    cases = {}  # (text, special) -> None: an ordered set
    for text in HAND_WRITTEN:
        cases[text, False] = cases[text, True] = None
    for name, words in WORDS.items():
        for w in words:
            cases[w, name == "control"] = cases[" " + w, False] = None
    for _ in range(200):
        cases[number(rng), False] = None
    for code in CODE:
        cases[code, False] = None
    for _ in range(150):
        cases["".join(rng.choice(WHITESPACE + ["a", "1", "b"]) for _ in range(rng.randrange(1, 10))), False] = None
    for _ in range(150):
        cases[random_codepoints(rng, rng.randrange(1, 40)), False] = None
    while len(cases) < 2100:
        text = mixture(rng)
        cases[text, False] = None
        if any(c in text for c in CONTROL_TEXTS) or rng.random() < 0.1:
            cases[text, True] = None
    for _ in range(8):  # a few long ones: a whole prompt's worth
        cases["".join(mixture(rng) for _ in range(60)), rng.random() < 0.5] = None
    return list(cases)


def gemma_strings() -> list[tuple[str, bool]]:
    """(text, special) pairs for Gemma 3: its tokens and hand-written cases both ways, then the first GEMMA_COUNT
    generated strings (with SmolLM2's control texts in them, plain text to Gemma)."""
    cases = {}
    for text in GEMMA_SPECIAL + GEMMA_HAND_WRITTEN:
        cases[text, False] = cases[text, True] = None
    for text, special in generate_strings()[:GEMMA_COUNT]:
        cases[text, special] = None
    return list(cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF file or model name (default: the default model)")
    parser.add_argument("--out", help=f"default: {OUT.name}, or {GEMMA_OUT.name} for gemma3-270m")
    args = parser.parse_args()
    gemma = args.model == "gemma3-270m"
    args.out = args.out or str(GEMMA_OUT if gemma else OUT)

    import llama_cpp

    from minitransformer.models import resolve_model_path

    llm = llama_cpp.Llama(model_path=str(resolve_model_path(args.model)), vocab_only=True, verbose=False)
    rows = [{"text": text, "special": special,
             "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)}
            for text, special in (gemma_strings() if gemma else generate_strings())]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} strings ({Path(args.out).stat().st_size / 1e6:.2f} MB) to {args.out}")


if __name__ == "__main__":
    main()
