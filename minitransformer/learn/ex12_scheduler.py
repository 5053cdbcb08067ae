"""Exercise 12: whom the scheduler preempts (serving/scheduler.py's Scheduler._victim)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from ..core.sampling_params import SamplingParams
from ..serving.block_manager import BlockManager
from ..serving.scheduler import Scheduler
from .track import CheckFailed, Exercise, compare, plugged, real_model, same_tokens

ENGINE_VICTIM = Scheduler._victim             # taken before any check plugs its adapter in
PROMPTS = ("The capital of France is", "Once upon a time", "def fib(n):", "The best way to learn is",
           "My favourite fruit is", "Water boils at", "In 1969 the first", "The opposite of hot is")
PRIORITIES = (2, 0, 1, 2, 0, 1, 3, 0)
MAX_TOKENS = 4
NUM_BLOCKS, BLOCK_SIZE, AGING_STEPS = 16, 2, 2   # 8 requests need ~40 blocks: the pool forces preemptions


def engine_choose_victim(running, policy, aging_steps):
    """The engine's own answer with the exercise's signature: a Scheduler with this running list."""
    scheduler = Scheduler(BlockManager(1), policy, aging_steps=aging_steps)
    scheduler.running = list(running)
    return ENGINE_VICTIM(scheduler)


def _oldest(running, policy, aging_steps):
    return running[0]


def _most_urgent(running, policy, aging_steps):
    if policy == "priority":
        return min(running, key=lambda s: (s.priority - s.waited_steps // aging_steps, s.arrival_index))
    return running[-1]


def _no_aging(running, policy, aging_steps):
    if policy == "priority":
        return max(running, key=lambda s: (s.priority, s.arrival_index))
    return running[-1]


def _older_on_ties(running, policy, aging_steps):
    if policy == "priority":
        return max(running, key=lambda s: (s.priority - s.waited_steps // aging_steps, -s.arrival_index))
    return running[-1]


def _ignores_policy(running, policy, aging_steps):
    return running[-1]


MISTAKES = (
    ("the oldest running request is preempted: it has the most work done and waited longest; the newest goes "
     "(the last of `running`, which is in admission order)", _oldest),
    ("under \"priority\" the MOST urgent request is preempted: the victim is the least urgent, the largest aged "
     "priority (lower numbers are more urgent)", _most_urgent),
    ("the aging is left out: the victim is chosen by the same aged priority that admitted it, priority - "
     "waited_steps // aging_steps, or a request that aging just let in is the first thrown out", _no_aging),
    ("among equal aged priorities the older arrival is preempted: the later one goes (the largest arrival_index)",
     _older_on_ties),
    ("the policy is ignored: under \"priority\" the victim is the least urgent running request, not the newest",
     _ignores_policy),
)


def _running(seed: int, count: int, aging_steps: int) -> list:
    """`count` running sequences in admission order, with priorities, waits and arrivals that make the rules differ."""
    rng = np.random.default_rng(seed)
    arrivals = sorted(rng.choice(50, count, replace=False))
    return [SimpleNamespace(request_id=f"request {a}", priority=int(rng.integers(0, 3)),
                            waited_steps=int(rng.integers(0, 3 * aging_steps)), arrival_index=int(a))
            for a in arrivals]


def _stage1(choose_victim) -> None:
    # seed 20's 7 requests tell every mistake apart: each one picks a different victim there
    for seed, policy, count in ((1, "continuous", 5), (20, "priority", 7), (2, "priority", 6),
                                (3, "priority", 8), (4, "priority", 7), (5, "continuous", 1),
                                (6, "priority", 8), (7, "priority", 5)):
        running = _running(seed, count, AGING_STEPS)
        shown = ", ".join(f"{s.request_id} (priority {s.priority}, waited {s.waited_steps})" for s in running)
        position = lambda fn, running=running: lambda *args: running.index(fn(*args))   # the victim's place
        victim = choose_victim(list(running), policy, AGING_STEPS)
        if not any(victim is s for s in running):
            raise CheckFailed(f"choose_victim(running, {policy!r}, {AGING_STEPS}) returned {victim!r}, not one of "
                              f"the running sequences")
        compare(f"the victim's index in running = [{shown}] under {policy!r}, aging_steps {AGING_STEPS}",
                running.index(victim), position(engine_choose_victim)(running, policy, AGING_STEPS),
                (running, policy, AGING_STEPS), [(label, position(fn)) for label, fn in MISTAKES], atol=0, rtol=0)


def _serve(choose_victim=None) -> tuple[list[list[int]], list[list[str]]]:
    """8 requests at once under "priority" in a pool too small for them: each one's tokens, and who was preempted at
    each step. choose_victim None: the engine's own."""
    from ..serving.engine import Engine
    engine = Engine(real_model(), max_num_seqs=len(PROMPTS), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                    policy="priority", aging_steps=AGING_STEPS, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for i, (prompt, priority) in enumerate(zip(PROMPTS, PRIORITIES)):
        engine.add_request(prompt, params, priority=priority, request_id=f"request {i}")
    adapter = ENGINE_VICTIM if choose_victim is None else \
        (lambda scheduler: choose_victim(list(scheduler.running), scheduler.policy, scheduler.aging_steps))
    with plugged(Scheduler, "_victim", adapter):
        results = engine.run()
    preempted = [record.preempted for record in engine.step_log]
    return [list(results[f"request {i}"].token_ids) for i in range(len(PROMPTS))], preempted


@functools.cache
def _reference_run():
    return _serve()


def check(choose_victim) -> list[str]:
    _stage1(choose_victim)
    expected, expected_preempted = _reference_run()
    got, preempted = _serve(choose_victim)
    for step, (theirs, ours) in enumerate(zip(expected_preempted, preempted)):
        if theirs != ours:
            raise CheckFailed(f"inside the engine (8 requests, {NUM_BLOCKS} blocks of {BLOCK_SIZE}, policy "
                              f"priority): at step {step} your choose_victim preempted {ours or 'nobody'}, the "
                              f"engine's {theirs or 'nobody'}")
    decode = real_model().tokenizer.decode
    for i, (prompt, want) in enumerate(zip(PROMPTS, expected)):
        same_tokens(f"the engine with your choose_victim, request {prompt!r}", got[i], want, decode)
    count = sum(map(len, preempted))
    return [f"your choose_victim ran the engine's preemptions: {len(PROMPTS)} requests (priorities {PRIORITIES}) at "
            f"once in a pool of {NUM_BLOCKS} blocks of {BLOCK_SIZE} tokens, policy priority with aging every "
            f"{AGING_STEPS} steps: {count} preemption{'s' * (count != 1)} over {len(preempted)} steps, the same "
            f"requests at the same steps as the engine's own",
            f"every request's {MAX_TOKENS} greedy tokens equal the reference's, token for token (a preempted request "
            f"is recomputed and goes on as if never interrupted)"]


EXERCISE = Exercise(
    number=12, name="scheduler", title="Continuous batching: whom to preempt", function="choose_victim",
    solution="minitransformer/serving/scheduler.py: Scheduler._victim (called by Scheduler.schedule when the block "
             "manager has no block for a running sequence; _preempt then frees it)",
    question="In continuous batching, what happens when the KV cache runs out mid-generation, and which request "
             "gives up its memory?",
    lesson="lessons/10_priority_and_starvation.py (priority, preemption, aging); lessons/08_static_vs_continuous_"
           "batching.py",
    hints=(
        "`running` is in admission order: under \"continuous\" the newest is its last element.",
        "Under \"priority\", the least urgent is the largest priority number; use max() with a key.",
        "The key is (priority - waited_steps // aging_steps, arrival_index): aged priority first, then the later "
        "arrival.",
    ),
    check=check, reference=engine_choose_victim, mistakes=MISTAKES,
)
