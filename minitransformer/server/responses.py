"""Response bodies out, in OpenAI's shapes: whole responses, server-sent-event chunks, usage, logprobs.

Streaming (`"stream": true`) sends `data: {chunk}\\n\\n` events and ends with `data: [DONE]\\n\\n`, as OpenAI does:
completions chunks carry `choices[0].text`, chat chunks `choices[0].delta` (the first one `{"role": "assistant"}`).
The last content chunk has the finish_reason; with `stream_options.include_usage` one more chunk follows with
`"choices": []` and the usage. Concatenating the deltas gives exactly the non-streaming text.

Finish reasons: as core/stopping.py's API_REASONS maps the engine's decisions: "stop" and "length" pass through;
`stop_reason` (vLLM's extension) is the stop string or stop token id that matched, and null for the end-of-sequence
token and for a completed structured-output constraint (a string there would read as a stop string that matched). A
structured request cut by max_tokens is "length" with the partial text, which will not parse: the body carries
nothing more, as OpenAI's does not. A request past --request-timeout is "length" with stop_reason "timeout"; any
other abort is "abort" (vLLM's value).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from ..core.request import Result
from ..core.stopping import api_reasons


def finish(result: Result) -> tuple[str, object]:
    """(finish_reason, stop_reason) as the API reports them (core/stopping.py's API_REASONS)."""
    return api_reasons(result.finish_reason, result.stop_reason)


def usage(result: Result) -> dict:
    return result.usage.to_dict()


def sse(data) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = sse("[DONE]")


class ResponseBuilder:
    """Builds every body of one request (id, created and model are shared by all its chunks)."""

    def __init__(self, request_id: str, model: str, chat: bool, tokenizer, top_logprobs: int | None,
                 return_token_ids: bool = False):
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())
        self.model, self.chat, self.tokenizer = model, chat, tokenizer
        self.top_logprobs = top_logprobs                     # None: logprobs were not asked for
        self.return_token_ids = return_token_ids             # vLLM's extension: token ids next to the text
        self.text_offset = 0                                 # completions logprobs: where the next token starts

    # ------------------------------------------------------------------ whole response (stream: false)

    def response(self, result: Result, logprob_entries: list[dict]) -> dict:
        finish_reason, stop_reason = finish(result)
        choice = {"index": 0, "logprobs": self.logprobs(logprob_entries), "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        if self.return_token_ids:
            choice["token_ids"] = list(result.token_ids)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": usage(result)}

    # ------------------------------------------------------------------ chunks (stream: true)

    def first_chunk(self) -> dict | None:
        """Chat streams open with the assistant's role (OpenAI's first delta); completions have no such chunk."""
        return self._chunk({"role": "assistant", "content": ""}, None, None) if self.chat else None

    def chunk(self, text: str, logprob_entries: list[dict], result: Result | None,
              token_ids: Sequence[int] = ()) -> dict:
        reasons = finish(result) if result is not None else (None, None)
        body = {"content": text} if self.chat else text
        chunk = self._chunk(body, self.logprobs(logprob_entries), *reasons)
        if self.return_token_ids:
            chunk["choices"][0]["token_ids"] = list(token_ids)      # this chunk's tokens
        return chunk

    def usage_chunk(self, result: Result) -> dict:
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": usage(result)}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, body, logprobs, finish_reason, stop_reason=None) -> dict:
        choice = {"index": 0, ("delta" if self.chat else "text"): body, "logprobs": logprobs,
                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [choice]}

    # ------------------------------------------------------------------ logprobs

    def logprobs(self, entries: list[dict]) -> dict | None:
        """The engine's {"token_id", "logprob", "top": [[id, logprob], ...]} entries in the API's two shapes."""
        if self.top_logprobs is None:
            return None
        if self.chat:
            return {"content": [{**self._token(e["token_id"], e["logprob"]),
                                 "top_logprobs": [self._token(i, lp) for i, lp in e["top"][:self.top_logprobs]]}
                                for e in entries]}
        texts = [self._text(e["token_id"]) for e in entries]
        offsets = []
        for text in texts:
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        return {"tokens": texts, "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{self._text(i): lp for i, lp in e["top"][:self.top_logprobs]} for e in entries],
                "text_offset": offsets}

    def _token(self, token_id: int, logprob: float) -> dict:
        return {"token": self._text(token_id), "logprob": logprob,
                "bytes": list(self.tokenizer.token_bytes(token_id))}

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])
