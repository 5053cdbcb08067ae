"""The tokenizer, read from the GGUF file: text -> token ids -> text (byte-level BPE, or SentencePiece's scores).

Why it is here: the model never sees text, only integers. This is the first stage of the serving loop
(`tokenize -> schedule -> prefill -> ...`) and the last one in reverse (ids -> text, see detokenizer.py). The tokenizer
lesson runs it piece by piece: pre-tokens, merges, ids.

The algorithm is GPT-2's byte-level BPE, and llama.cpp is our reference for the exact token ids:

1. Control tokens (`<|im_start|>`, `<|im_end|>`, ...) are cut out of the text whole -- only when `special=True`.
   With `special=False` a user typing "<|im_end|>" gets ordinary text tokens and cannot end the turn. A chat prompt
   (`encode_chat`) is both: the template's own text with `special=True`, the messages' contents with `special=False`.
2. The pre-tokenizer splits the rest into words with regexes (pretokenize.py). SmolLM2's ("smollm") first isolates
   every digit, then applies GPT-2's regex to each piece: so "2024" is 4 tokens and "x  1" is "x", "  ", "1".
3. Each word's UTF-8 bytes are written as printable characters (GPT-2's byte map: space -> 'Ġ'), then BPE merges
   adjacent symbols, always the pair that comes first in the merges list, until no listed pair is left (bpe.py).
4. Each final symbol is a vocabulary entry: its index is the token id. No BOS is added.

A file whose `tokenizer.ggml.model` is "llama" (Gemma, Llama 2) is SentencePiece-style instead: no pre-tokenizer and
no byte map; steps 2-4 become spm.py's merge by token scores with byte fallback, on each run of plain text. Step 1,
decoding and the chat template are the same code for both.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence

import regex

from .bpe import bpe
from .chat_template import ChatTemplate, check_messages
from .errors import InputError, ModelFileError
from .pretokenize import PRE_TOKENIZERS, compile_like_llamacpp, pre_tokenize
from .spm import SPACE, SentencePieceEncoder

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type (llama_token_type)
BPE, SENTENCEPIECE = "gpt2", "llama"   # tokenizer.ggml.model values we run: byte-level BPE, SentencePiece-style
MODELS = (BPE, SENTENCEPIECE)

# Texts llama.cpp takes for end-of-generation tokens and marks control whatever type the file gives them
# (llama_vocab::impl::load, "control-looking token"): Gemma 3's "</s>" is user-defined in the file, yet llama.cpp
# matches it only with special=True. These are the ones our two tokenizer kinds can meet.
CONTROL_LOOKING = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                             "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>"})

CACHE_LIMIT = 50_000  # merged words remembered; cleared when full (prompts repeat words a lot)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to 256 printable characters.

    BPE works on strings, and a vocabulary full of raw control bytes and spaces would be unreadable. So the 188
    printable bytes stand for themselves and the other 68 are moved to chr(256), chr(257), ... in byte order:
    space 0x20 becomes 'Ġ' (U+0120), newline 0x0A becomes 'Ċ' (U+010A).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, moved = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + moved)
            moved += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


class Tokenizer:
    """Byte-level BPE (model "gpt2") or SentencePiece-style (model "llama") with control tokens and a chat template,
    as stored in a GGUF file.

    add_bos: the file asks for BOS before a prompt (tokenizer.ggml.add_bos_token); `encode` never adds it, the
    caller that builds a prompt does. add_space_prefix (SentencePiece only): a '▁' starts each run of plain text
    that begins the text or follows a special token, as llama.cpp does.
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int], merges: Iterable[str] = (), *,
                 pre: str = "smollm", bos_id: int | None = None, eos_id: int | None = None,
                 chat_template: str | None = None, model: str = "gpt2", scores: Sequence[float] | None = None,
                 add_space_prefix: bool = False, add_bos: bool = False):
        if model not in MODELS:
            raise ModelFileError(f"tokenizer model {model!r} is not supported: we run byte-level BPE ('gpt2') and "
                                 "SentencePiece-style ('llama')")
        if model == BPE and pre not in PRE_TOKENIZERS:
            raise ModelFileError(f"tokenizer pre-tokenizer {pre!r} is not supported (we run {sorted(PRE_TOKENIZERS)})")
        self.model = model
        self.tokens = list(tokens)
        self.token_types = [CONTROL if t in CONTROL_LOOKING else kind for t, kind in zip(self.tokens, token_types)]
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            pair = merge.split(" ")  # a symbol never contains a space (a space byte is written 'Ġ')
            if len(pair) != 2 or not all(pair):
                raise ModelFileError(f"tokenizer merge {rank} is {merge!r}; expected two symbols separated by a space")
            self.ranks[pair[0], pair[1]] = rank
        self.pre = pre
        self.patterns = [compile_like_llamacpp(p) for p in PRE_TOKENIZERS[pre]] if model == BPE else []
        self.spm: SentencePieceEncoder | None = None
        if model == SENTENCEPIECE:
            if scores is None or len(scores) != len(self.tokens):
                raise ModelFileError(f"a SentencePiece-style tokenizer needs one score per token ({len(self.tokens)})"
                                     f", got {'none' if scores is None else len(scores)}")
            self.spm = SentencePieceEncoder(self.token_to_id, scores, add_space_prefix)
        self.add_bos = add_bos
        self.bos_id, self.eos_id = bos_id, eos_id
        self.chat_template = chat_template
        self.control_ids = frozenset(i for i, t in enumerate(self.token_types) if t == CONTROL)
        # Tokens whose text is matched whole in the input (as llama.cpp: control and unknown ones only with
        # special=True, user-defined ones always) and whose text is stored as is, not through the byte map.
        self._raw_text_ids = {i for i, t in enumerate(self.token_types) if t in (CONTROL, UNKNOWN, USER_DEFINED)}
        user_defined = [i for i in self._raw_text_ids if self.token_types[i] == USER_DEFINED]
        self._special_regex = {True: self._alternation(self._raw_text_ids), False: self._alternation(user_defined)}
        self._cache: dict[str, list[int]] = {}
        self._chat: ChatTemplate | None = None  # compiled on first use

    def _alternation(self, ids: Iterable[int]) -> regex.Pattern | None:
        """One regex matching any of these tokens' texts, longest first (a longer token wins over its prefix)."""
        texts = sorted({self.tokens[i] for i in ids if self.tokens[i]}, key=len, reverse=True)
        return regex.compile("|".join(regex.escape(t) for t in texts)) if texts else None

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        """Read the tokenizer.ggml.* fields of an open `gguf.GGUFReader`."""

        def field(key, default=KeyError):
            if key in reader.fields:
                return reader.fields[key].contents()
            if default is KeyError:
                raise ModelFileError(f"model file has no {key!r} field: it carries no tokenizer we can use")
            return default

        model = field("tokenizer.ggml.model")
        if model not in MODELS:
            raise ModelFileError(f"tokenizer model {model!r} is not supported: we run byte-level BPE ('gpt2') and "
                                 "SentencePiece-style ('llama')")
        pre = field("tokenizer.ggml.pre", "default")  # llama.cpp's name for "not given"; checked in __init__
        tokens = field("tokenizer.ggml.tokens")
        spm = model == SENTENCEPIECE
        # llama.cpp's defaults when the file is silent: SentencePiece adds BOS and the space prefix, BPE neither.
        return cls(tokens, field("tokenizer.ggml.token_type", [NORMAL] * len(tokens)),
                   [] if spm else field("tokenizer.ggml.merges"), pre=pre,
                   bos_id=field("tokenizer.ggml.bos_token_id", None), eos_id=field("tokenizer.ggml.eos_token_id", None),
                   chat_template=field("tokenizer.chat_template", None), model=model,
                   scores=field("tokenizer.ggml.scores") if spm else None,
                   add_space_prefix=bool(field("tokenizer.ggml.add_space_prefix", spm)),
                   add_bos=bool(field("tokenizer.ggml.add_bos_token", spm)))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # ---- text -> ids

    def encode(self, text: str, special: bool = False, limit: int | None = None) -> list[int]:
        """Text -> token ids. `special=True` turns control-token text such as "<|im_end|>" into its single id.

        limit: stop as soon as there are more than `limit` ids (they are then the first ones of the full answer), so
        a prompt far too long for the context is refused without tokenizing all of it.
        """
        check_text(text)
        return self._encode_pieces(self._split_special(text, special), limit)

    def _encode_pieces(self, pieces: Iterable[tuple[str, int | None]], limit: int | None = None) -> list[int]:
        """[(plain text, None) | (special token text, its id)] -> ids, stopping once there are more than `limit`."""
        ids: list[int] = []
        for word_ids in self._word_ids(pieces):
            ids.extend(word_ids)
            if limit is not None and len(ids) > limit:
                break                                  # too long already: the rest would only be thrown away
        return ids

    def _word_ids(self, pieces: Iterable[tuple[str, int | None]]) -> Iterator[list[int]]:
        """The ids of each special token and of each pre-token, in order (lazily: the caller may stop early)."""
        after_special = True
        for piece, special_id in pieces:
            if special_id is not None:
                yield [special_id]
            elif self.spm is not None:                 # SentencePiece: the whole run at once (spm.py)
                yield self.spm.encode(piece, after_special)
            else:
                for word in pre_tokenize(piece, self.patterns):
                    yield self._encode_word(word)
            after_special = special_id is not None

    def _split_special(self, text: str, special: bool) -> list[tuple[str, int | None]]:
        """Cut special-token text out whole: [(text, None) for plain pieces, (token text, its id) for specials]."""
        pattern = self._special_regex[special]
        if pattern is None:
            return [(text, None)]
        out: list[tuple[str, int | None]] = []
        start = 0
        for m in pattern.finditer(text):
            if m.start() > start:
                out.append((text[start : m.start()], None))
            out.append((m.group(), self.token_to_id[m.group()]))
            start = m.end()
        if start < len(text):
            out.append((text[start:], None))
        return out

    def _encode_word(self, word: str) -> list[int]:
        """One pre-token -> ids, via its bytes as GPT-2 characters and BPE; remembered in a bounded cache."""
        ids = self._cache.get(word)
        if ids is None:
            symbols = bpe([BYTE_TO_CHAR[b] for b in word.encode("utf-8")], self.ranks)
            ids = []
            for symbol in symbols:
                if symbol in self.token_to_id:
                    ids.append(self.token_to_id[symbol])
                else:  # fall back to one token per byte; bytes without a token are dropped, as llama.cpp does
                    ids.extend(self.token_to_id[c] for c in symbol if c in self.token_to_id)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    # ---- ids -> text

    def _check_id(self, token_id) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise InputError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= i < len(self.tokens):
            n = len(self.tokens)
            raise InputError(f"token id {i} is out of range for vocab size {n} (valid ids: 0..{n - 1})")
        return i

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (control tokens: their text, e.g. b"<|im_end|>").

        SentencePiece: '▁' is a space, a byte token `<0xE2>` is that byte, an unused token nothing (as llama.cpp's
        token_to_piece). No leading space is ever stripped: llama.cpp strips one from the first token when the file
        sets add_space_prefix, but then the text streamed token by token (detokenizer.py) would differ from the
        decode of the same ids; a file with add_space_prefix decodes encode(text) to " " + text.
        """
        i = self._check_id(token_id)
        piece = self.tokens[i]
        if i in self._raw_text_ids:
            return piece.encode("utf-8")
        if self.spm is not None:
            kind = self.token_types[i]
            if kind == BYTE:
                return bytes([int(piece[3:5], 16)])
            return b"" if kind == UNUSED else piece.replace(SPACE, " ").encode("utf-8")
        if not all(c in CHAR_TO_BYTE for c in piece):
            return piece.encode("utf-8")
        return bytes(CHAR_TO_BYTE[c] for c in piece)

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Ids -> raw bytes; may end inside a UTF-8 character (the streaming detokenizer handles that)."""
        ids = [self._check_id(i) for i in ids]
        return b"".join(self.token_bytes(i) for i in ids if not (skip_special and i in self.control_ids))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Ids -> text. Bytes that do not form valid UTF-8 (a cut-off character) become U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary string of one token, as stored (a space shows as 'Ġ', a newline as 'Ċ')."""
        return self.tokens[self._check_id(token_id)]

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_piece(i) for i in ids]

    # ---- chat

    def render_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """Messages [{"role", "content"}, ...] -> prompt text, with the model's own template (chat_template.py).

        This is the text to show a human. To feed the model use `encode_chat`: encoding this text with `special=True`
        would also turn control-token text typed inside a message into real control tokens.
        """
        return self._template().render(messages, add_generation_prompt)

    def encode_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                    allow_special_in_content: bool = False, limit: int | None = None) -> list[int]:
        """Messages -> the ids of the chat prompt, where only the template's own text yields control tokens.

        A content is text: "hi<|im_end|>\\n<|im_start|>system" typed by a user stays plain tokens, and cannot end the
        turn or forge a system message. The contents join the template's text before pre-tokenization, so ordinary
        messages get exactly the ids of `encode(render_chat(messages), special=True)`, the prompt the model was
        trained on. allow_special_in_content=True encodes that whole text with special=True instead; pass the ids
        it returns as the prompt (a list of ids) to run it. limit: as for `encode`.
        """
        template = self._template()
        if allow_special_in_content:
            return self.encode(template.render(messages, add_generation_prompt), special=True, limit=limit)
        self._refuse_control_text(messages, "role", "a role is written into the template's own text")
        segments = template.render_segments(messages, add_generation_prompt)
        if segments is None:        # the template rewrites contents (e.g. trims them), so they cannot be cut out
            self._refuse_control_text(messages, "content", "this model's chat template rewrites contents, so they "
                                      "cannot be kept apart from its control tokens")
            return self.encode(template.render(messages, add_generation_prompt), special=True, limit=limit)
        check_text("".join(text for text, _ in segments))
        pieces = [piece for text, is_content in segments for piece in self._split_special(text, not is_content)]
        return self._encode_pieces(join_plain(pieces), limit)

    def _refuse_control_text(self, messages: Sequence[Mapping[str, str]], field: str, why: str) -> None:
        """InputError if a message's `field` holds the text of a control (or unknown) token, which special=True
        would turn into that token; user-defined tokens are matched in any text, so they are no risk."""
        check_messages(messages)
        for n, m in enumerate(messages):
            found = [i for _, i in self._split_special(m[field], True) if i is not None]
            if any(self.token_types[i] != USER_DEFINED for i in found):
                raise InputError(f"messages[{n}] ({m['role']!r}) has control-token text in its {field}, and {why} "
                                 "(allow_special_in_content=True makes it control tokens)")

    def _template(self) -> ChatTemplate:
        """The model's chat template, compiled on first use."""
        if self._chat is None:
            if not self.chat_template:
                raise ModelFileError("model file has no tokenizer.chat_template: use a plain prompt (chat=False)")
            special = lambda i: self.tokens[i] if i is not None and 0 <= i < len(self.tokens) else ""
            self._chat = ChatTemplate(self.chat_template, bos_token=special(self.bos_id),
                                      eos_token=special(self.eos_id))
        return self._chat

    def __repr__(self) -> str:
        if self.spm is not None:
            return f"Tokenizer(vocab_size={self.vocab_size}, model='llama', add_bos={self.add_bos})"
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.ranks)}, pre={self.pre!r})"


def check_text(text) -> None:
    """One clear line for text that cannot be tokenized: not a str, or a lone surrogate (no UTF-8 for it)."""
    if not isinstance(text, str):
        raise InputError(f"text to tokenize must be a str, got {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"text has a lone surrogate {text[e.start]!r} at position {e.start}") from None


def join_plain(pieces: Iterable[tuple[str, int | None]]) -> list[tuple[str, int | None]]:
    """Join neighbouring plain-text pieces, so the pre-tokenizer sees the runs it would see in one whole text."""
    out: list[tuple[str, int | None]] = []
    for text, special_id in pieces:
        if special_id is None and out and out[-1][1] is None:
            out[-1] = (out[-1][0] + text, None)
        else:
            out.append((text, special_id))
    return out


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer of a GGUF model file (`minitransformer.load_tokenizer` also takes a known model's name)."""
    from .gguf_file import open_gguf

    return Tokenizer.from_gguf(open_gguf(path))
