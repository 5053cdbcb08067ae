"""Serving many requests at once: paged KV cache, block manager, schedulers and the engine (lessons 08-10).

One concept per file, named after its vLLM counterpart, in the order a request meets them:
sequence.py (a request's state) -> scheduler.py (who runs this step) -> block_manager.py (which cache blocks)
-> model_runner.py + paged_cache.py (one forward over all scheduled tokens; graph_runner.py and cuda_graph.py replay
decode-only steps from CUDA graphs on a GPU) -> engine_args.py (an engine's sizes) -> engine.py (the loop and the
API) -> outputs.py (what it reports: its read API); kv_transfer.py: a prefill engine and a decode engine joined.
"""

from .block_manager import BlockManager, BlockState
from .engine import Engine
from .engine_args import EngineArgs
from .outputs import EngineConfig, EngineSnapshot, EngineStats, RequestOutput, SequenceView, StepRecord
from .paged_cache import PagedKVCache
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence, SequenceStatus

__all__ = ["Engine", "EngineArgs", "EngineStats", "RequestOutput", "StepRecord", "EngineConfig", "EngineSnapshot",
           "SequenceView", "BlockState", "BlockManager", "PagedKVCache", "Scheduler", "SchedulerOutput", "Sequence",
           "SequenceStatus"]
