"""Capture a step of GPU work once as a CUDA graph and replay it: one launch instead of hundreds.

A decode step of the 135M model is ~30 layers x ~15 kernels, each a few microseconds of GPU work but ~5-10 us of
Python and launch overhead: at batch 1 the GPU mostly waits for the host. Stream capture records the launches
into a graph; `replay()` submits the whole graph with one call (the idea behind vLLM's and PyTorch's CUDA graphs).

The rules a captured step must follow (CUDA stream capture):
- fixed shapes and addresses: inputs are *static buffers* written in place before each replay (`inputs[...] = x`),
  outputs are the arrays the capture produced, overwritten by each replay;
- nothing that reads back to the host (no `int(array)`, `.get()`, sync) inside the step, and no Python decision that
  depends on the step's values (a Python int that changes per step, like KVCache.length, is baked in at capture);
- memory allocated during capture must never be handed to anyone else: the capture runs on a private memory pool
  that this object keeps for as long as the graph lives.
The serving engine captures its decode steps this way (serving/graph_runner.py); scripts/gpu_check.py measures
graphs against plain launches. Needs CuPy and a GPU; cupy is imported inside the class, so this loads anywhere.
"""

from __future__ import annotations


class GraphedStep:
    """fn(*static_inputs) captured once; replay() reruns it on whatever the static inputs hold now."""

    def __init__(self, fn, *static_inputs, warmup: int = 1):
        import cupy
        self.inputs = static_inputs
        self.pool = cupy.cuda.MemoryPool()              # private: the graph's intermediates live here for good
        self.stream = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.get_current_stream().synchronize()   # the inputs are written; the warm-up reads them
        with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
            for _ in range(warmup):                     # compile kernels, load modules, plan cuBLAS outside capture
                fn(*static_inputs)
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self.outputs = fn(*static_inputs)       # recorded, not run
            finally:
                self.graph = self.stream.end_capture()

    def replay(self):
        """Launch the captured graph on its stream, wait for it, and return the (overwritten) outputs.

        The static inputs were written on the caller's stream; the graph's stream is non-blocking (no implicit order
        with the default stream), so it first waits for an event recorded there.
        """
        import cupy
        self.stream.wait_event(cupy.cuda.get_current_stream().record())
        self.graph.launch(self.stream)
        self.stream.synchronize()
        return self.outputs

