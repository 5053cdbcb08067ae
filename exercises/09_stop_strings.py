"""Exercise 09: stop strings, and what to hold back while streaming.

A stop string ("math problem") ends a reply as soon as the text contains it, and the text is cut where it starts.
It is searched in the detokenized text, not in tokens: " math" and " problem" are two tokens, and neither contains
"math problem". After every token the loop knows the text so far and how many characters that token added.

    find_stop_string(text, new_chars, stops) -> (start, stop) or None

The first stop string that the last new_chars characters of text complete: the index where it starts in text, and
the string. Search only where a stop could END inside the new characters (earlier text was searched at earlier
tokens): from max(0, len(text) - new_chars - len(stop) + 1). When several complete at once, the one that starts
earliest in the text wins, then the shorter one, then list order.

    held_back(text, pending, stops) -> int

While streaming, the last `pending` characters of text are not shown yet. Hold back the longest suffix of those
that is a proper prefix of some stop string (it might still become one): with stop "math problem", a text ending
in " mat" holds back 3 ("mat"). At most `pending` characters; 0 when nothing could begin a stop string.

Shapes: plain Python strings; new_chars and pending are character counts (a token that only starts a multi-byte
character adds 0 characters).

Pitfalls: searching only the new characters (a stop that straddles two tokens is missed); returning the index after
the stop string; holding back nothing (the stop string's first half is streamed before the token that completes it
arrives, and cannot be taken back).

Check it: `minitransformer learn check stop_strings` (cases, then the real loop with stop "math problem").
Stuck: `minitransformer learn hint stop_strings`.
"""


def find_stop_string(text, new_chars, stops):
    raise NotImplementedError("write find_stop_string")


def held_back(text, pending, stops):
    raise NotImplementedError("write held_back")
