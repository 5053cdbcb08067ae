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
tenant's unfinished requests may hold at most tenant_token_quota tokens (prompt + max_tokens) in flight.
Lessons 08 (static vs continuous), 09 (paged attention) and 10 (priority) drive it and read `step_log`.

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
from typing import Any

from ..core.backend import check_count, keep_freed_memory
from ..core.errors import InputError, QuotaError
from ..core.kv_cache import estimate_kv_bytes
from ..core.kv_storage import check_storage
from ..core.metrics import now
from ..core.request import Result, make_request
from ..core.sampling import SamplingParams, next_tokens
from ..core.stopping import StopDecision
from . import model_runner
from .block_manager import BlockManager
from .graph_runner import DecodeGraphs, graphs_refusal
from .kv_transfer import CONSUMER, PRODUCER, KVConnector, KVTransfer, PrefillRequest, TransferStats
from .outputs import EngineConfig, EngineSnapshot, EngineStats, RequestOutput, SequenceView, StepRecord
from .paged_cache import PagedKVCache
from .scheduler import POLICIES, Scheduler
from .sequence import Sequence, SequenceStatus

# num_blocks=None: enough blocks for max_num_seqs full contexts, but no more than this many bytes of K and V
# (16 full 8192-token contexts of the default model would be 6 GiB).
DEFAULT_KV_CACHE_BYTES = 512 * 2**20
STEP_LOG_SIZE = 4096        # step_log keeps the latest this many records (a server steps forever)
FINISHED_KEPT = 32          # snapshot().finished: the requests that finished lately
REMOTE_WAIT_S = 0.005       # a consumer with nothing to compute waits this long for a prefill before step() returns


class Engine:
    """Many requests on one model: add_request / step / run / abort, stats and step_log (see the module docstring).

    max_num_seqs and max_num_batched_tokens bound one step (sequences, tokens); num_blocks x block_size tokens of
    K and V are allocated once (num_blocks=None: as many as max_num_seqs full contexts need, capped at
    kv_cache_bytes); policy "continuous" | "static" | "priority" (scheduler.py); kv_cache "f32" | "int8", the
    pool's storage (kv_storage.py: more tokens in the same bytes, lesson 13 measures the quality cost);
    cuda_graphs: replay decode-only steps from CUDA graphs (default: on a GPU with the paged_decode kernel; on the
    CPU True runs the same static-buffer step without capture, which is how its equivalence is tested; refused under
    tensor parallelism). `model` may be rank 0's DriverTransformer (parallel/driver.py): each step's forward then
    reaches the other ranks' shards and pools, and nothing here changes. kv_connector: one side of a disaggregated
    pair (kv_transfer.py): a kv_producer engine only prefills and hands each prompt's KV off at its first token; a
    kv_consumer engine sends its prompts away and decodes what comes back (lesson 16).
    """

    def __init__(self, model, max_num_seqs: int = 16, num_blocks: int | None = None, block_size: int = 16,
                 policy: str = "continuous", max_num_batched_tokens: int = 512, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, tenant_token_quota: int | dict | None = None,
                 aging_steps: int = 32, kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES, kv_cache: str = "f32",
                 cuda_graphs: bool | None = None, kv_connector: KVConnector | None = None):
        config = model.config
        check_storage(kv_cache)
        self.kv_bytes = lambda tokens: estimate_kv_bytes(config, tokens, storage=kv_cache)   # K and V of `tokens`
        if policy not in POLICIES:
            raise InputError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        # every size is checked as an integer before it is multiplied into a byte count
        max_num_seqs, block_size, max_num_batched_tokens, aging_steps, kv_cache_bytes = (
            check_count(name, value) for name, value in (
                ("max_num_seqs", max_num_seqs), ("block_size", block_size),
                ("max_num_batched_tokens", max_num_batched_tokens), ("aging_steps", aging_steps),
                ("kv_cache_bytes", kv_cache_bytes)))
        self.max_model_len = config.context_length if max_model_len is None else check_count("max_model_len",
                                                                                            max_model_len)
        if not 1 <= self.max_model_len <= config.context_length:
            raise InputError(f"max_model_len must be in [1, {config.context_length}] (the model's context), "
                             f"got {max_model_len}")
        if num_blocks is None:
            per_block = self.kv_bytes(block_size)
            num_blocks = max(1, min(max_num_seqs * -(-self.max_model_len // block_size),
                                    kv_cache_bytes // per_block))
        num_blocks = check_count("num_blocks", num_blocks)
        keep_freed_memory()          # no page faults on each step's temporaries (backend.py says why)
        self.model = model
        # cuda_graphs: decode-only steps replay a CUDA graph per padded batch size, whose padding rows write into one
        # scratch block past the block manager's (graph_runner.py). None: on a GPU when paged_decode reads the pool;
        # the array path would gather max_model_len keys per sequence and layer in every graphed step.
        refusal = graphs_refusal(model)
        if cuda_graphs and refusal:
            raise InputError(refusal)
        reads_pool = model.attention.reads_pool(check_storage(kv_cache))
        self.cuda_graphs = (model.device == "gpu" and reads_pool and refusal is None) if cuda_graphs is None \
            else bool(cuda_graphs)
        # The pool first: its memory check refuses an impossible num_blocks before the block manager's per-block
        # bookkeeping is built.
        self.cache = PagedKVCache(config, num_blocks + self.cuda_graphs, block_size, xp=model.xp, storage=kv_cache)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        # No sequence is longer than the pool: the RoPE table and the graphs' block tables need no more positions.
        longest = min(self.max_model_len, num_blocks * block_size)
        model.reserve_positions(longest)
        self.graphs = None
        if self.cuda_graphs:
            # a step decodes at most max_num_batched_tokens sequences (one token each): no larger graph is needed
            self.graphs = DecodeGraphs(model, self.cache, min(max_num_seqs, max_num_batched_tokens),
                                       -(-longest // block_size),
                                       scratch_block=num_blocks, capture=model.device == "gpu")
        self.scheduler = Scheduler(self.block_manager, policy, max_num_seqs, max_num_batched_tokens, aging_steps)
        self.config = EngineConfig(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, policy,
                                   self.max_model_len, self.kv_bytes(num_blocks * block_size))
        self.tenant_token_quota = tenant_token_quota
        self.sequences: dict[str, Sequence] = {}         # unfinished requests
        self.step_log: list[StepRecord] = []             # the latest STEP_LOG_SIZE steps, trimmed by step()
        self._finished: collections.deque[SequenceView] = collections.deque(maxlen=FINISHED_KEPT)
        self.num_steps = 0
        self._pending: list[RequestOutput] = []          # aborts, reported by the next step()
        self._arrivals = itertools.count()
        self._num_prompt_tokens = self._num_generation_tokens = 0
        # Disaggregated prefill/decode (kv_transfer.py): a producer hands each prefilled request off; a consumer
        # sends its requests' prompts away and adopts what comes back.
        self.kv_connector: Any = kv_connector          # a KVConnector (None: this engine prefills and decodes)
        self.kv_role = None if kv_connector is None else kv_connector.role
        if self.kv_role not in (None, PRODUCER, CONSUMER):
            raise InputError(f"kv_connector.role must be {PRODUCER!r} or {CONSUMER!r}, got {self.kv_role!r}")
        if self.kv_role is not None and policy == "static":
            raise InputError("disaggregated prefill/decode admits each request when its prefill comes back; the "
                             "static policy's fixed groups cannot: use continuous or priority")
        self._remote: dict[str, Sequence] = {}                     # consumer: at the prefill engine
        self._arrived: collections.deque[tuple[Sequence, KVTransfer]] = collections.deque()   # back, not adopted
        self._transfer_stats = TransferStats()

    # ------------------------------------------------------------------ requests in

    def add_request(self, prompt, params: SamplingParams | None = None, chat: bool = False, priority: int = 0,
                    tenant: str | None = None, request_id: str | None = None,
                    arrival_time: float | None = None, cache_salt: str | None = None) -> str:
        """Queue a request (text, token ids, or chat messages with chat=True); return its id. InputError if it can
        never be served or breaks a limit -- before any work, never left hanging.

        cache_salt (vLLM's name): the request reuses and leaves behind prefix-cache blocks only among requests with
        the same salt (block_manager.py), so requests of different salts cannot learn each other's prompts from the
        cache. None, the default, is one more salt: every unsalted request shares with the others."""
        params = params if params is not None else SamplingParams()
        request = make_request(self.model, prompt, params, chat, arrival_time)
        if request_id is not None:
            request.request_id = str(request_id)
        if request.request_id in self.sequences or any(o.request_id == request.request_id for o in self._pending):
            raise InputError(f"request id {request.request_id!r} is already in use by an unfinished request")
        total = len(request.prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InputError(f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) "
                             f"= {total} exceeds max_model_len {self.max_model_len}")
        bm = self.block_manager
        capacity = bm.num_blocks * bm.block_size
        if total - 1 > capacity:                         # the last sampled token's K/V is never computed
            prompt_len = len(request.prompt_token_ids)
            what = (f"the prompt ({prompt_len} tokens)" if prompt_len > capacity
                    else f"prompt + max_tokens ({total} tokens)")
            raise InputError(f"{what} does not fit in the whole KV cache ({bm.num_blocks} blocks x "
                             f"{bm.block_size} = {capacity} tokens); raise num_blocks or lower max_tokens")
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
        if self.kv_role == CONSUMER:                     # its prompt is prefilled elsewhere (kv_transfer.py)
            self._remote[request.request_id] = seq
            self.kv_connector.request_prefill(PrefillRequest(
                request.request_id, request.prompt_token_ids, params, request.arrival_time, int(priority),
                cache_salt))
        else:
            self.scheduler.add(seq)
        return request.request_id

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """Finish a request now (finish_reason "abort", stop_reason `reason`: "cancelled" or "timeout") and free its
        blocks; its final RequestOutput comes with the next step(). Aborting a finished request does nothing."""
        seq = self.sequences.get(request_id)
        if seq is not None and self._remote.pop(request_id, None) is not None:
            self.kv_connector.abort(request_id)          # the prefill engine frees its blocks too
        if seq is not None:
            self._pending.append(self._finish(seq, StopDecision("abort", reason), new_tokens=[]))

    def has_unfinished_requests(self) -> bool:
        return bool(self.sequences) or bool(self._pending)

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward over every scheduled token, sample, stream. Returns this step's outputs."""
        outputs, self._pending = self._pending, []
        start = now()
        if self.kv_role == CONSUMER:
            outputs += self._adopt_arrived()
        plan = self.scheduler.schedule()
        if not plan.scheduled and (self._remote or self._arrived):
            if not outputs:
                self.kv_connector.wait(REMOTE_WAIT_S)    # nothing to compute here: wait for a prefill, briefly
            return outputs                               # no forward ran: no step to record
        decode_tokens = 0
        if plan.scheduled:
            for seq, _ in plan.scheduled:
                if seq.metrics.scheduled_time is None:
                    seq.metrics.mark_scheduled()                         # queue time ends at the first schedule
            inputs = model_runner.prepare(plan.scheduled, self.block_manager, self.model.xp)
            logits = None
            if self.graphs is not None and self.graphs.can_run(inputs):
                logits = self.graphs.run(inputs)                                   # (R, V), or None: no graph
            if logits is None:
                logits = model_runner.execute(self.model, self.cache, inputs)      # (R, V)
            for seq, n in plan.scheduled:
                decode_tokens += seq.is_decode(n)
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
            self._num_prompt_tokens += plan.num_batched_tokens - decode_tokens
            if inputs.sampled:
                tokens, logprobs = next_tokens(logits, inputs.sampled)             # (R,) on the host, R entries
                if self.kv_role == PRODUCER:                 # a prefill engine's requests end at their first token
                    for seq, token, entry in zip(inputs.sampled, tokens, logprobs):
                        self._hand_off(seq, int(token), entry)
                else:
                    outputs += [self._append_token(seq, int(token), entry)
                                for seq, token, entry in zip(inputs.sampled, tokens, logprobs)]
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

    def _append_token(self, seq: Sequence, token: int, logprobs: dict | None) -> RequestOutput:
        """The request's own stages (request.RequestState.append); a finished one leaves the engine."""
        self._num_generation_tokens += 1
        delta = seq.append(token, logprobs)
        if delta.finish_reason is not None:
            self._release(seq)
        return RequestOutput(seq.request_id, delta)

    def _finish(self, seq: Sequence, decision: StopDecision, new_tokens: list[int]) -> RequestOutput:
        """End a request now (an abort): its Result, then its blocks freed."""
        delta = seq.finish(decision, new_tokens)
        self._release(seq)
        return RequestOutput(seq.request_id, delta)

    def _release(self, seq: Sequence) -> None:
        """A finished sequence leaves the scheduler and gives its blocks back; snapshot() shows it a while longer."""
        self.scheduler.remove(seq)
        self.block_manager.free(seq)
        del self.sequences[seq.request_id]
        if self._arrived:                                 # aborted after its KV came back, before adoption
            self._arrived = collections.deque(a for a in self._arrived if a[0] is not seq)
        seq.status = SequenceStatus.FINISHED
        self._finished.appendleft(SequenceView.of(seq, ()))

    # ------------------------------------------------------------------ disaggregated prefill/decode

    def _hand_off(self, seq: Sequence, token: int, logprobs: dict | None) -> None:
        """Producer: the prompt is in the pool and its first token sampled; send both (and the generator's state)
        to the decode engine, and let the request go here without a Result: the decode engine reports it."""
        arrays = self.cache.export_tokens(self.block_manager.block_tables[seq.request_id], seq.num_computed_tokens)
        scheduled = seq.metrics.scheduled_time
        transfer = KVTransfer(seq.request_id, seq.num_computed_tokens, token, logprobs,
                              seq.generator.bit_generator.state, now() if scheduled is None else scheduled, arrays)
        self._num_generation_tokens += 1
        self.scheduler.remove(seq)
        self.block_manager.free(seq)                      # before sending: the pool's report is then up to date
        del self.sequences[seq.request_id]
        seq.status = SequenceStatus.FINISHED
        self.kv_connector.send(transfer)

    def _adopt_arrived(self) -> list[RequestOutput]:
        """Consumer: take in the prefills that came back. Each gets blocks of this pool, its keys and values
        written into them, and its first token appended; then it decodes like any running sequence. One that
        finds no seat or no blocks waits, in arrival order, for a later step; one aborted meanwhile is dropped."""
        stats = self._transfer_stats
        for transfer, seconds in self.kv_connector.receive():
            seq = self._remote.pop(transfer.request_id, None)
            if seq is None:
                stats.discarded += 1                       # aborted while it was away: nothing to adopt
                continue
            stats.transfers += 1
            stats.bytes += transfer.nbytes
            stats.seconds += seconds
            stats.last.append((transfer.nbytes, seconds))
            self._arrived.append((seq, transfer))
        outputs = []
        while self._arrived and len(self.scheduler.running) < self.scheduler.max_num_seqs:
            seq, transfer = self._arrived[0]
            if not self.block_manager.allocate_slots(seq, transfer.num_tokens):
                break                                     # blocks free up as running sequences finish
            self._arrived.popleft()
            self.cache.import_tokens(self.block_manager.block_tables[seq.request_id], transfer.arrays)
            seq.num_computed_tokens = transfer.num_tokens
            seq.metrics.scheduled_time = transfer.scheduled_time       # queue time: until the prefill engine began
            seq.generator.bit_generator.state = transfer.generator_state
            self.block_manager.cache_full_blocks(seq)
            self.scheduler.adopt(seq)
            outputs.append(self._append_token(seq, transfer.token, transfer.logprobs))   # may finish it at once
        return outputs

    # ------------------------------------------------------------------ observability

    @property
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), bm.usage,
                           self.scheduler.num_preemptions, bm.prefix_cache_queries, bm.prefix_cache_hits,
                           self.num_steps, self._num_prompt_tokens, self._num_generation_tokens,
                           bm.num_free_blocks, bm.num_blocks)

    def take_kv_transfer_stats(self) -> TransferStats | None:
        """A consumer's transfers so far (None for an engine without a kv_connector). `last` holds the (bytes,
        seconds) of each transfer since the previous call: this call takes them (the server's histograms do)."""
        if self.kv_connector is None:
            return None
        self.kv_connector.refresh()
        stats = self._transfer_stats
        last, stats.last = stats.last, []
        pool = self.kv_connector.producer_pool                           # (blocks used, blocks) as last reported
        return dataclasses.replace(stats, last=last, in_flight=len(self._remote) + len(self._arrived),
                                   producer_blocks_used=None if pool is None else pool[0],
                                   producer_num_blocks=None if pool is None else pool[1])

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
