"""The serving engine: many requests at once on one model (vLLM's LLMEngine, in miniature).

    engine = Engine(model, max_num_seqs=16, policy="continuous")
    rid = engine.add_request("The capital of France is", SamplingParams(max_tokens=16, temperature=0.0))
    while engine.has_unfinished_requests():
        for out in engine.step(): print(out.request_id, out.delta.text)       # or: results = engine.run()

Each step: the scheduler picks sequences and token counts (scheduler.py) -> one forward over all their tokens
through the paged KV cache (model_runner.py) -> every sequence whose pending tokens are done samples one token, in
one batched sampling.next_tokens() call (which also gives each its logprobs) -> per sequence, the same stages as
generate.py (request.RequestState.append: record the logprobs, detokenize, check_stop, stream a Delta, build the
Result on finish), and a finished sequence's blocks are freed. A request's
tokens do not depend on what it is batched with: its logits are its own rows of the matmuls and its own attention
(equal to its logits alone up to float32 rounding: BLAS may sum a row in another order when the batch has other
rows), and its sampler row uses its own generator. The tests check identical tokens; a near-tie in the logits could
in principle still flip one.

Admission control (add_request raises InputError with the numbers): the generate.py checks (context length,
vocabulary, ...), prompt + max_tokens <= max_model_len, the request must fit in the whole KV pool by itself, and a
tenant's unfinished requests may hold at most tenant_token_quota tokens (prompt + max_tokens) in flight. A request
given a timeout is aborted at the first step after its deadline (stopping.check_abort, as generate's loop does).
Lessons 08 (static vs continuous), 09 (paged attention) and 10 (priority) drive it and read `step_log`.

What it is given rather than imports: its sizes as EngineArgs (engine_args.py), and, for disaggregated
prefill/decode, a kv_connector whose hooks (KVHooks below; kv_transfer.ConnectorSide) it calls at four points. The
forward itself, on the paged pool and through CUDA graphs where they serve, is the ModelRunner's (model_runner.py).

The read API (outputs.py), all a caller above the engine needs: step() -> a RequestOutput per request (its Delta: new
tokens, text, logprob entries, the Result at the end); `stats`; `config` (the fixed sizes); `snapshot()` (the queues,
each block's state and the block tables, the requests finished lately); `recent_steps(n)` (the latest StepRecords,
copied); `unfinished_request_ids()`. `step_log` is the engine's own, bounded list (the latest STEP_LOG_SIZE records):
read it between steps, never change it. The block manager, the scheduler and the sequences are the engine's private
parts: the layering test keeps the server and the CLI off them.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Protocol

from ..core.errors import InputError, QuotaError
from ..core.kv_cache import estimate_kv_bytes
from ..core.metrics import now
from ..core.request import Result, make_request
from ..core.sampling import next_tokens
from ..core.sampling_params import SamplingParams
from ..core.stopping import StopDecision, check_abort
from .block_manager import BlockManager
from .engine_args import EngineArgs
from .model_runner import ModelRunner, keep_freed_memory, prepare
from .outputs import EngineConfig, EngineSnapshot, EngineStats, RequestOutput, SequenceView, StepRecord
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus

STEP_LOG_SIZE = 4096        # step_log keeps the latest this many records (a server steps forever)
FINISHED_KEPT = 32          # snapshot().finished: the requests that finished lately


class KVHooks(Protocol):
    """What the engine asks of its kv_connector, one side of a disaggregated pair (kv_transfer.ConnectorSide)."""
    role: str

    def admit(self, engine: Engine, seq: Sequence) -> bool: ...      # sent away to be prefilled: not scheduled here

    def cancel(self, request_id: str) -> None: ...

    def released(self, seq: Sequence) -> None: ...

    def hand_off(self, engine: Engine, seq: Sequence, token: int, logprobs: dict | None) -> bool: ...

    def adopt(self, engine: Engine) -> list[RequestOutput]: ...

    def idle(self, waited_for: bool) -> bool: ...

    def transfer_stats(self) -> Any: ...


class Engine:
    """Many requests on one model: add_request / step / run / abort, stats and step_log (see the module docstring).

    args: EngineArgs, or its fields as keywords (Engine(model, max_num_seqs=8)): max_num_seqs and
    max_num_batched_tokens bound one step (sequences, tokens); num_blocks x block_size tokens of K and V are
    allocated once (num_blocks=None: as many as max_num_seqs full contexts need, capped at kv_cache_bytes); policy
    "continuous" | "static" | "priority" (scheduler.py); kv_cache "f32" | "int8", the pool's storage (kv_storage.py:
    more tokens in the same bytes, lesson 13 measures the quality cost); cuda_graphs: replay decode-only steps from
    CUDA graphs (model_runner.py; refused under tensor parallelism). `model` may be rank 0's DriverTransformer
    (parallel/driver.py): each step's forward then reaches the other ranks' shards and pools, and nothing here
    changes. kv_connector: one side of a disaggregated pair (kv_transfer.py): a kv_producer engine only prefills
    and hands each prompt's KV off at its first token; a kv_consumer engine sends its prompts away and decodes what
    comes back (lesson 16).
    """

    def __init__(self, model, args: EngineArgs | None = None, *, kv_connector: KVHooks | None = None,
                 **options):
        args = dataclasses.replace(args or EngineArgs(), **options)     # checked again (EngineArgs.__post_init__)
        config = model.config
        self.args = args
        self.kv_bytes = lambda tokens: estimate_kv_bytes(config, tokens, storage=args.kv_cache)   # K and V bytes
        self.max_model_len = config.context_length if args.max_model_len is None else args.max_model_len
        if not 1 <= self.max_model_len <= config.context_length:
            raise InputError(f"max_model_len must be in [1, {config.context_length}] (the model's context), "
                             f"got {args.max_model_len}")
        num_blocks = args.num_blocks
        if num_blocks is None:
            num_blocks = max(1, min(args.max_num_seqs * -(-self.max_model_len // args.block_size),
                                    args.kv_cache_bytes // self.kv_bytes(args.block_size)))
        if kv_connector is not None and args.policy == "static":
            raise InputError("disaggregated prefill/decode admits each request when its prefill comes back; the "
                             "static policy's fixed groups cannot: use continuous or priority")
        keep_freed_memory()          # no page faults on each step's temporaries (model_runner.py says why)
        self.model = model
        # No sequence is longer than the pool: the RoPE table and the graphs' block tables need no more positions.
        longest = min(self.max_model_len, num_blocks * args.block_size)
        model.reserve_positions(longest)
        # The pool first (in the runner): its memory check refuses an impossible num_blocks before the block
        # manager's per-block bookkeeping is built. A step decodes at most max_num_batched_tokens sequences.
        self.runner = ModelRunner(model, num_blocks, args.block_size, args.kv_cache,
                                  min(args.max_num_seqs, args.max_num_batched_tokens), longest, args.cuda_graphs)
        self.block_manager = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, args.policy, args.max_num_seqs, args.max_num_batched_tokens,
                                   args.aging_steps)
        self.config = EngineConfig(num_blocks, args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                                   args.policy, self.max_model_len, self.kv_bytes(num_blocks * args.block_size))
        self.tenant_token_quota = args.tenant_token_quota
        self.sequences: dict[str, Sequence] = {}         # unfinished requests
        self.deadlines: dict[str, float] = {}            # request id -> when it times out (metrics.now()'s clock)
        self.step_log: list[StepRecord] = []             # the latest STEP_LOG_SIZE steps, trimmed by step()
        self._finished: collections.deque[SequenceView] = collections.deque(maxlen=FINISHED_KEPT)
        self.num_steps = 0
        self._pending: list[RequestOutput] = []          # aborts, reported by the next step()
        self._arrivals = itertools.count()
        self._num_prompt_tokens = self._num_generation_tokens = 0
        self._num_masks, self._mask_s = 0, 0.0      # of finished requests' constraints (stats adds the running)
        self.kv_connector = kv_connector                 # None: this engine prefills and decodes
        self.kv_role = None if kv_connector is None else kv_connector.role

    cache = property(lambda self: self.runner.cache)     # the paged KV pool (paged_cache.PagedKVCache)
    graphs = property(lambda self: self.runner.graphs)   # the decode steps' CUDA graphs, or None
    cuda_graphs = property(lambda self: self.runner.cuda_graphs)

    # ------------------------------------------------------------------ requests in

    def add_request(self, prompt, params: SamplingParams | None = None, chat: bool = False, priority: int = 0,
                    tenant: str | None = None, request_id: str | None = None,
                    arrival_time: float | None = None, cache_salt: str | None = None,
                    timeout: float | None = None) -> str:
        """Queue a request (text, token ids, or chat messages with chat=True); return its id. InputError if it can
        never be served or breaks a limit -- before any work, never left hanging.

        cache_salt (vLLM's name): the request reuses and leaves behind prefix-cache blocks only among requests with
        the same salt (block_manager.py), so requests of different salts cannot learn each other's prompts from the
        cache. None, the default, is one more salt: every unsalted request shares with the others.
        timeout: seconds after its arrival when the request is aborted (finish_reason "abort", stop_reason
        "timeout"), checked before each step."""
        params = params if params is not None else SamplingParams()
        if timeout is not None and not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                                        and timeout > 0):
            raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
        request = make_request(self.model, prompt, params, chat, arrival_time)
        if request_id is not None:
            request.request_id = str(request_id)
        if request.request_id in self.sequences or any(o.request_id == request.request_id for o in self._pending):
            raise InputError(f"request id {request.request_id!r} is already in use by an unfinished request")
        total = len(request.prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InputError(f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) "
                             f"= {total} exceeds max_model_len {self.max_model_len}", param="max_tokens")
        bm = self.block_manager
        capacity = bm.num_blocks * bm.block_size
        if total - 1 > capacity:                         # the last sampled token's K/V is never computed
            prompt_len = len(request.prompt_token_ids)
            what = (f"the prompt ({prompt_len} tokens)" if prompt_len > capacity
                    else f"prompt + max_tokens ({total} tokens)")
            raise InputError(f"{what} does not fit in the whole KV cache ({bm.num_blocks} blocks x "
                             f"{bm.block_size} = {capacity} tokens); raise num_blocks or lower max_tokens",
                             param="prompt" if prompt_len > capacity else "max_tokens")
        if self.tenant_token_quota is not None:
            quota = self.tenant_token_quota
            limit = quota.get(tenant) if isinstance(quota, dict) else quota
            if limit is not None:
                held = sum(s.num_prompt_tokens + s.params.max_tokens for s in self.sequences.values()
                           if s.tenant == tenant)
                if held + total > limit:
                    raise QuotaError(f"tenant {tenant!r} would hold {held + total} tokens in flight (prompt + "
                                     f"max_tokens of its unfinished requests), over its quota of {limit}")
        seq = Sequence(request, self.model.tokenizer, self.model.config.context_length, self.kv_bytes,
                       priority=int(priority), tenant=tenant, arrival_index=next(self._arrivals),
                       cache_salt=cache_salt)
        self.sequences[request.request_id] = seq
        if timeout is not None:
            self.deadlines[request.request_id] = request.arrival_time + timeout
        if self.kv_connector is None or not self.kv_connector.admit(self, seq):   # a decode engine sends it away
            self.scheduler.add(seq)
        return request.request_id

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """Finish a request now (finish_reason "abort", stop_reason `reason`: "cancelled" or "timeout") and free its
        blocks; its final RequestOutput comes with the next step(). Aborting a finished request does nothing."""
        seq = self.sequences.get(request_id)
        if seq is None:
            return
        if self.kv_connector is not None:
            self.kv_connector.cancel(request_id)         # one at the prefill engine is aborted there too
        self._pending.append(self._finish(seq, StopDecision("abort", reason), new_tokens=[]))

    def has_unfinished_requests(self) -> bool:
        return bool(self.sequences) or bool(self._pending)

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward over every scheduled token, sample, stream. Returns this step's outputs."""
        outputs, self._pending = self._pending, []
        start = now()
        outputs += self._expire()
        if self.kv_connector is not None:
            outputs += self.kv_connector.adopt(self)     # a decode engine takes in the prefills that came back
        plan = self.scheduler.schedule()
        if not plan.scheduled and self.kv_connector is not None and self.kv_connector.idle(bool(outputs)):
            return outputs                               # requests are away; no forward ran: no step to record
        decode_tokens = 0
        if plan.scheduled:
            for seq, _ in plan.scheduled:
                if seq.metrics.scheduled_time is None:
                    seq.metrics.mark_scheduled()                         # queue time ends at the first schedule
            inputs = prepare(plan.scheduled, self.block_manager, self.model.xp)
            logits = self.runner.execute(inputs)                                   # (R, V)
            for seq, n in plan.scheduled:
                decode_tokens += seq.is_decode(n)
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
            self._num_prompt_tokens += plan.num_batched_tokens - decode_tokens
            if inputs.sampled:
                tokens, logprobs = next_tokens(logits, inputs.sampled)             # (R,) on the host, R entries
                for seq, token, entry in zip(inputs.sampled, tokens, logprobs):
                    if self.kv_connector is not None and self.kv_connector.hand_off(self, seq, int(token), entry):
                        self._num_generation_tokens += 1         # a prefill engine's requests end at their first token
                        continue
                    outputs.append(self.append_token(seq, int(token), entry))
        self.step_log.append(StepRecord(
            step=self.num_steps, request_ids=[s.request_id for s, _ in plan.scheduled],
            num_prefill_tokens=plan.num_batched_tokens - decode_tokens, num_decode_tokens=decode_tokens,
            num_batched_tokens=plan.num_batched_tokens, duration_s=now() - start,
            kv_cache_usage=self.block_manager.usage, num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running), preempted=[s.request_id for s in plan.preempted]))
        if len(self.step_log) > STEP_LOG_SIZE:
            del self.step_log[0]                          # shifts STEP_LOG_SIZE pointers: microseconds a step
        self.num_steps += 1
        return outputs

    def run(self) -> dict[str, Result]:
        """Step until every request has finished; the Results of the requests that finished meanwhile, by id."""
        results: dict[str, Result] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.result is not None:                  # a finished request's output carries its Result
                    results[out.request_id] = out.result
        return results

    # ------------------------------------------------------------------ per-sequence stages (as generate.py)

    def append_token(self, seq: Sequence, token: int, logprobs: dict | None) -> RequestOutput:
        """The request's own stages (request.RequestState.append); a finished one leaves the engine."""
        self._num_generation_tokens += 1
        delta = seq.append(token, logprobs)
        if delta.finish_reason is not None:
            self._release(seq)
        return RequestOutput(seq.request_id, delta)

    def _expire(self) -> list[RequestOutput]:
        """The requests past their deadline end now, before the step's work (stopping.check_abort's rule)."""
        expired = [(rid, decision) for rid, deadline in self.deadlines.items()
                   if (decision := check_abort(deadline, None)) is not None]
        return [self._finish(self.sequences[rid], decision, new_tokens=[]) for rid, decision in expired]

    def _finish(self, seq: Sequence, decision: StopDecision, new_tokens: list[int]) -> RequestOutput:
        """End a request now (an abort): its Result, then its blocks freed."""
        delta = seq.finish(decision, new_tokens)
        self._release(seq)
        return RequestOutput(seq.request_id, delta)

    def _release(self, seq: Sequence) -> None:
        """A finished sequence leaves the scheduler and gives its blocks back; snapshot() shows it a while longer."""
        self._leave(seq)
        if self.kv_connector is not None:
            self.kv_connector.released(seq)
        self._finished.appendleft(SequenceView.of(seq, ()))

    def _leave(self, seq: Sequence) -> None:
        if seq.constraint is not None:
            self._num_masks += seq.constraint.masks
            self._mask_s += seq.constraint.mask_s
        self.scheduler.remove(seq)
        self.block_manager.free(seq)
        del self.sequences[seq.request_id]
        self.deadlines.pop(seq.request_id, None)
        seq.status = SequenceStatus.FINISHED

    # ------------------------------------------------------------------ the pool, for a kv_connector

    def export_kv(self, seq: Sequence) -> list:
        """A prefill engine hands a request off: its prompt's stored K and V copied out of the pool (the arrays of
        paged_cache.PagedKVCache.export_tokens), then the request leaves this engine with its blocks freed (before
        the transfer is sent, so the pool's report is up to date)."""
        arrays = self.cache.export_tokens(self.block_manager.block_tables[seq.request_id], seq.num_computed_tokens)
        self._leave(seq)
        return arrays

    def import_kv(self, seq: Sequence, num_tokens: int, arrays: list, scheduled_time: float) -> bool:
        """A decode engine adopts a request whose prompt was prefilled elsewhere: a seat and blocks of this pool,
        its keys and values written into them, then it runs like any other; False when there is no room yet."""
        if len(self.scheduler.running) >= self.scheduler.max_num_seqs:
            return False
        if not self.block_manager.allocate_slots(seq, num_tokens):
            return False                                  # blocks free up as running sequences finish
        self.cache.import_tokens(self.block_manager.block_tables[seq.request_id], arrays)
        seq.num_computed_tokens = num_tokens
        seq.metrics.scheduled_time = scheduled_time       # queue time: until the prefill engine began
        self.block_manager.cache_full_blocks(seq)
        self.scheduler.adopt(seq)
        return True

    # ------------------------------------------------------------------ observability

    @property
    def stats(self) -> EngineStats:
        bm = self.block_manager
        running = [seq.constraint for seq in list(self.sequences.values()) if seq.constraint is not None]
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), bm.usage,
                           self.scheduler.num_preemptions, bm.prefix_cache_queries, bm.prefix_cache_hits,
                           self.num_steps, self._num_prompt_tokens, self._num_generation_tokens,
                           bm.num_free_blocks, bm.num_blocks,
                           self._num_masks + sum(c.masks for c in running),
                           self._mask_s + sum(c.mask_s for c in running))

    def take_kv_transfer_stats(self):
        """A decode engine's transfers so far (kv_transfer.TransferStats; None for an engine without a
        kv_connector). `last` holds the (bytes, seconds) of each transfer since the previous call: this call takes
        them (the server's histograms do)."""
        return None if self.kv_connector is None else self.kv_connector.transfer_stats()

    def snapshot(self) -> EngineSnapshot:
        """The queues, every block's state and reference count, the block tables, the requests finished lately: plain
        values that stay true while the engine steps on. One pass over the pool and the unfinished sequences: build
        it between steps, in the thread that steps the engine (the live page does, only while someone watches)."""
        bm, scheduler = self.block_manager, self.scheduler
        view = lambda seq: SequenceView.of(seq, bm.block_tables.get(seq.request_id, ()))
        return EngineSnapshot(self.num_steps, self.config, self.stats, tuple(map(view, scheduler.running)),
                              tuple(map(view, scheduler.waiting)), tuple(bm.block_states()), tuple(bm.ref_counts),
                              tuple(self._finished))

    def recent_steps(self, count: int) -> list[StepRecord]:
        """The latest `count` StepRecords (at most STEP_LOG_SIZE), as a new list another thread may keep."""
        return self.step_log[-count:] if count > 0 else []

    def unfinished_request_ids(self) -> list[str]:
        """Every request not finished yet, running or waiting, in the order they were added."""
        return list(self.sequences)
