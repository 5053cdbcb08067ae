"""The scheduler: before every step, which sequences run and how many of their tokens (vLLM v1's Scheduler).

One rule covers prefill and decode: a sequence needs num_tokens - num_computed_tokens more tokens computed before it
can sample (1 for a decode, the rest of its prompt for a prefill). Each step has a token budget,
`max_num_batched_tokens`, and at most `max_num_seqs` sequences run. In order:

1. RUNNING sequences first, in the order they were admitted, each getting min(what it needs, budget left) tokens:
   a long prompt is split across steps (chunked prefill) so decodes keep flowing next to it. If the block manager
   cannot give a sequence the blocks it needs, a running sequence is *preempted*: its blocks are freed and it goes
   back to the front of the waiting queue, to be recomputed later (vLLM v1 preempts by recompute, never by swapping;
   the victim is the newest admitted one, or the least urgent under "priority"). Its output so far is kept, and so
   is its random generator, so it finishes with the same tokens it would have produced without the interruption.
2. Then, if nothing was preempted this step, WAITING sequences are admitted while budget, seats and blocks last,
   each starting after the longest prefix already in the prefix cache.

Policies:
- "continuous": iteration-level batching, first come first served (Orca / vLLM): requests join and leave between
  any two steps, so a finished sequence's seat is refilled at once.
- "static": fixed groups. A group of up to max_num_seqs waiting requests is formed when the previous group has
  completely finished; no one else joins until then. A short request's seat stays empty while its group runs.
- "priority": like continuous, but the waiting queue is ordered by priority (lower number = more urgent, as vLLM)
  then arrival, and the preemption victim is the least urgent running sequence. Aging keeps low priority from
  starving: every `aging_steps` steps a request waits, its effective priority improves by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus

POLICIES = ("continuous", "static", "priority")


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)   # (sequence, tokens to compute)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, policy: str = "continuous", max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 512, aging_steps: int = 32):
        self.block_manager = block_manager
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.aging_steps = aging_steps
        self.waiting: list[Sequence] = []       # WAITING and PREEMPTED sequences
        self.running: list[Sequence] = []       # in admission order
        self.group: set[Sequence] = set()       # "static": the current group's unfinished members
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def adopt(self, seq: Sequence) -> None:
        """A sequence whose prompt another engine prefilled (kv_transfer.py) joins the running batch: its blocks are
        allocated and filled, and its next step is a decode. The engine checks max_num_seqs first."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence (the engine frees its blocks)."""
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue.remove(seq)
        self.group.discard(seq)

    # ------------------------------------------------------------------ one step's decision

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids = set()
        i = 0
        while i < len(self.running) and budget > 0:          # 1. running sequences, oldest first
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(seq, n):
                victim = self._victim()
                self._preempt(victim)
                out.preempted.append(victim)
                if id(victim) in scheduled_ids:               # "priority" may pick one scheduled earlier this step
                    out.scheduled = [(s, m) for s, m in out.scheduled if s is not victim]
                    scheduled_ids.discard(id(victim))
                    budget = self.max_num_batched_tokens - out.num_batched_tokens
                    i -= 1
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, n))
                scheduled_ids.add(id(seq))
                budget -= n
                i += 1
        if not out.preempted:                                 # 2. admit waiting sequences
            self._admit(out, budget)
        for seq in self.waiting:
            seq.waited_steps += 1
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        if self.policy == "static" and not self.group and not self.running:
            self.group = set(self.waiting[:self.max_num_seqs])            # a new fixed group
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._next_waiting()
            if seq is None:
                break
            cached = bm.find_cached_prefix(seq)
            num_cached = len(cached) * bm.block_size
            n = min(seq.num_tokens - num_cached, budget)
            if not bm.allocate_slots(seq, n, cached):
                break                                                    # wait for blocks to be freed
            bm.prefix_cache_queries += seq.num_tokens                    # counted once admitted, as vLLM
            bm.prefix_cache_hits += num_cached
            self.waiting.remove(seq)
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING       # waited_steps is kept: a preempted request keeps its aging
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n

    def _next_waiting(self) -> Sequence | None:
        if self.policy == "priority":
            return min(self.waiting, key=self.effective_priority)
        if self.policy == "static":
            return next((s for s in self.waiting if s in self.group), None)
        return self.waiting[0]

    def effective_priority(self, seq: Sequence) -> tuple[int, int]:
        """(priority improved by one per aging_steps steps waited, arrival order): smaller runs first."""
        return (seq.priority - seq.waited_steps // self.aging_steps, seq.arrival_index)

    def _victim(self) -> Sequence:
        """Whom to preempt: the newest running sequence (vLLM v1), or under "priority" the least urgent one by the
        same aged priority that admitted it (else a request aging just let in would be the first thrown out)."""
        if self.policy == "priority":
            return max(self.running, key=self.effective_priority)
        return self.running[-1]

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, seq)                   # first in line again (FCFS order is kept among preempted)
