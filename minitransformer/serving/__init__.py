"""Serving many requests at once: paged KV cache, block manager, schedulers and the engine (lessons 08-10).

One concept per file, named after its vLLM counterpart, in the order a request meets them:
sequence.py (a request's state) -> scheduler.py (who runs this step) -> block_manager.py (which cache blocks)
-> model_runner.py + paged_cache.py (one forward over all scheduled tokens; graph_runner.py replays decode-only
steps from CUDA graphs on a GPU) -> engine.py (the loop and the API) -> outputs.py (what it reports: its read API).
"""

from .block_manager import BlockManager, BlockState
from .engine import Engine
from .outputs import EngineConfig, EngineSnapshot, EngineStats, RequestOutput, SequenceView, StepRecord
from .paged_cache import PagedKVCache
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence, SequenceStatus

__all__ = ["Engine", "EngineStats", "RequestOutput", "StepRecord", "EngineConfig", "EngineSnapshot", "SequenceView",
           "BlockState", "BlockManager", "PagedKVCache", "Scheduler", "SchedulerOutput", "Sequence", "SequenceStatus"]
