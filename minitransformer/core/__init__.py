"""What one request needs on one device, and nothing else: read the model file, tokenize, run the forward pass with
a KV cache, sample, detokenize, stop, stream, and the loop that calls them in order.

core/ imports nothing outside itself and no optional library; every optimization (kernels/, quantize/, parallel/,
structured/, no_cache.py, speculative/, serving/) imports core and plugs into a protocol it defines here:
attention.AttentionBackend, model.AllReduce, loading.Shard, sampling_params.TokenMask, generate.Runner.

docs/code_tour.md lists its files in reading order with their sizes, and follows one token through them.
"""
