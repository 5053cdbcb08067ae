"""Exercise 15: Server-Sent Events, the framing of a streamed completion.

With "stream": true the server answers with Content-Type text/event-stream and sends each chunk of the completion
as it is made, as OpenAI and vLLM do. Every event is one field line and a blank line:

    data: {"id": "cmpl-...", "object": "text_completion", "choices": [{"index": 0, "text": " Paris", ...}]}\n
    \n

and the stream ends with the event `data: [DONE]`. A client (the openai package, a browser's EventSource) reads lines
up to each blank line, joins the `data:` lines of that event, and parses the JSON. So:

    sse(data) -> str

data: a dict (a chunk, the usage chunk, an error object) or a str (the final "[DONE]"). Returns the whole event:
"data: " + the JSON of the dict on ONE line (json.dumps; ensure_ascii=False keeps " café" readable, as the server
does) or the string as it is, then "\n\n". The server calls it for every event it sends (server/app.py's _events).

Pitfalls: one "\n" at the end (the blank line is what ends an event: without it the next event's line joins this
one and the JSON no longer parses); pretty-printed JSON (json.dumps(..., indent=2) puts newlines inside the event, so
its lines are separate fields); no "data: " prefix (a line without a known field name is ignored by the client).

Check it: `minitransformer learn check sse`. Stuck: `minitransformer learn hint sse`.
"""

import json  # noqa: F401  (you will want it)


def sse(data):
    raise NotImplementedError("write sse")
