"""Exercise 10: UTF-8-safe streaming.

The model produces tokens; a byte-level BPE token is a run of bytes, not of characters. SmolLM2 writes the emoji 🍽
(U+1F37D, 4 bytes F0 9F 8D BD) as three tokens: b"\xf0\x9f", b"\x8d", b"\xbd". Decoding each token on its own
would stream "\ufffd\ufffd..." where the emoji belongs. So the detokenizer keeps the bytes of an unfinished
character until the rest arrives, and streams only what decodes completely.

    complete_prefix(data: bytes) -> int

The number of leading bytes of `data` that can be decoded now: len(data), unless data ends inside a character
whose remaining bytes have not arrived; then the index where that character starts. The engine's detokenizer calls
it with the bytes it holds after each token, decodes data[:n] and keeps data[n:] for the next token.

UTF-8 in one table: 0xxxxxxx a 1-byte character; 110xxxxx, 1110xxxx, 11110xxx the first byte of a 2-, 3-, 4-byte
character; 10xxxxxx a continuation byte. Examples: complete_prefix(b"caf\xc3") == 3; complete_prefix(b"\xf0\x9f") ==
0; complete_prefix("café".encode()) == 5. The check feeds valid UTF-8 cut at every byte.

Pitfalls: decoding everything at once with errors="replace" (a split character becomes U+FFFD and is streamed);
holding back only one byte (an emoji's first two bytes can arrive together, with two still missing).

Check it: `minitransformer learn check detokenizer` (every prefix of some texts, then the real model streaming a
pizza-emoji reply through your function). Stuck: `minitransformer learn hint detokenizer`.
"""


def complete_prefix(data):
    raise NotImplementedError("write complete_prefix")
