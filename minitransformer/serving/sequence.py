"""One request's state inside the serving engine: its tokens, how many of them are in the KV cache, and its status.

    WAITING --scheduled--> RUNNING --stop / length--> FINISHED
       ^                      |
       +------ PREEMPTED <----+   (blocks ran out: its cache is dropped and recomputed later, vLLM's "recompute")

The one counter that drives everything is `num_computed_tokens`: how many of the sequence's tokens (prompt, then
output) have their keys and values in the cache. A step computes tokens [num_computed_tokens, +n); when that reaches
`num_tokens`, the step produced the logits of the next token, which is sampled and appended. A decode computes the
one token sampled last (`is_decode`), a prefill chunk anything else, and re-prefilling a preempted request is the
same thing again from 0, so the scheduler never needs to tell them apart (vLLM v1's scheduler works the same way).
Invariant: 0 <= num_computed_tokens < num_tokens while the sequence is unfinished.
A Sequence *is* a request.RequestState (the output, detokenizer, random stream and the finishing stages that
generate() uses too) plus what only a scheduler needs.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from ..core.request import Request, RequestState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Sequence(RequestState):
    """A request being served (the engine makes one per add_request). Compared by identity.

    kv_bytes(tokens) -> bytes: what the engine's pool spends on that many tokens (the Result reports it).
    """

    def __init__(self, request: Request, tokenizer, context_length: int, kv_bytes: Callable[[int], int],
                 priority: int = 0, tenant: str | None = None, arrival_index: int = 0,
                 cache_salt: str | None = None):
        super().__init__(request, tokenizer, context_length,
                         kv_usage=lambda: (self.num_computed_tokens, kv_bytes(self.num_computed_tokens)))
        self.priority = priority                    # lower = more urgent (vLLM's convention)
        self.tenant = tenant
        self.cache_salt = cache_salt                # prefix-cache blocks are shared only within one salt
        self.arrival_index = arrival_index          # order of add_request: FCFS ties and "newest" for preemption
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []            # physical block of each logical block, in order
        self.num_preemptions = 0
        self.waited_steps = 0                       # steps spent waiting, over all its waits (aging)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output so far: what the cache must hold before the next token can be sampled."""
        return len(self.request.prompt_token_ids) + len(self.output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    def is_decode(self, num_new_tokens: int) -> bool:
        """Whether computing num_new_tokens more is a decode: exactly one token, the one sampled last. Anything
        else (a prompt, a chunk of one, a re-prefill after preemption) is a prefill chunk. The model runner splits
        a step's rows by it and the engine counts decode tokens by it: the one definition of a decode."""
        return num_new_tokens == 1 and bool(self.output_ids) and self.num_computed_tokens == self.num_tokens - 1

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output (without building the whole list: a decode asks for one)."""
        prompt, P = self.request.prompt_token_ids, len(self.request.prompt_token_ids)
        if start >= P:
            return self.output_ids[start - P:end - P]
        if end <= P:
            return prompt[start:end]
        return prompt[start:] + self.output_ids[:end - P]
