"""Run by tests/test_serving_engine.py in a process of its own: the minor page faults of two Engine rounds run in a
thread, the way the HTTP server runs its engine (server/engine_loop.py).

    python tests/engine_page_faults.py MODEL keep|return    -> prints a JSON list: faults per round

"return" replaces model_runner.keep_freed_memory with a no-op before the Engine is built, so the C allocator keeps its
defaults and hands freed memory back to the OS: the contrast the test needs to show the setting does something.
"""

import json
import resource
import sys
import threading

from minitransformer import SamplingParams, load_model
from minitransformer.bench.serve_workload import make_prompts
from minitransformer.serving import engine as engine_module


def faults_per_round(model, rounds: int = 2) -> list[int]:
    """Two rounds are enough: the first pays for memory the process never had, the second shows whether memory the
    first round freed was kept (a few faults) or handed back and faulted in again (as many as the first)."""
    faults = []
    for round_ in range(rounds):
        engine = engine_module.Engine(model, max_num_seqs=8)
        for prompt in make_prompts(8, seed=0, round=round_):           # 16-200 words each, new text every round
            engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        engine.run()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults


if __name__ == "__main__":
    if sys.argv[2] == "return":
        engine_module.keep_freed_memory = lambda: False
    loaded = load_model(sys.argv[1])
    result = []
    worker = threading.Thread(target=lambda: result.extend(faults_per_round(loaded)))
    worker.start()
    worker.join()
    print(json.dumps(result))
