"""Exercise 01: BPE, the tokenizer's merge step.

Before the model sees text, the tokenizer cuts it into pre-tokens (words with their leading space, digits,
punctuation: core/pretokenize.py) and turns each pre-token into vocabulary pieces with byte-pair encoding. Each byte
of the word becomes one symbol (a printable stand-in character per byte, GPT-2's convention: a space is "Ġ", "é" is
the two bytes "Ã©"), and then the merges learned in training are applied:

    repeat: among the adjacent pairs (symbols[i], symbols[i + 1]) that are in `ranks`, take the one with the
            smallest rank (learned first; the leftmost if it occurs more than once) and join it into one symbol;
    until no adjacent pair is in `ranks`.

    bpe(symbols, ranks) -> the pieces, a list of str

Shapes for SmolLM2-135M: `ranks` maps 48,900 pairs (left, right) to their rank 0, 1, 2, ...; " capital" arrives
as ["Ġ", "c", "a", "p", "i", "t", "a", "l"] and leaves as ["Ġcapital"], one piece of the 49,152-token vocabulary.
The tokenizer then looks each piece's id up.

Pitfalls: the smallest rank merges first, not the largest; after each merge look again, because the new symbol
forms new pairs with its neighbours (one pass is not enough); among equal ranks the leftmost goes first ("aaa" with
the merge ("a", "a") is ["aa", "a"]); a word of one symbol or none has nothing to merge.

Check it: `minitransformer learn check bpe` (toy merges first, then SmolLM2's own on real words, then the real
tokenizer and model with your bpe inside). Stuck: `minitransformer learn hint bpe`.
"""


def bpe(symbols, ranks):
    raise NotImplementedError("write bpe")
