"""The runtimes: planned buffers and compiled graphs, one runtime per task kind.

compiled.py is what both share (the cache key, load-or-compile, the eager fallback, the
warm-up, the status); aot.py the AOTInductor package cache; buffers.py the planned
buffers; staging.py a batch's host-built metadata on its way to the device (pinned,
non-blocking); graphs.py CUDA graph capture and replay of fixed-shape calls; prefill.py and
beam.py the two runtimes, beam_batch.py what a beam batch carries between the walk's moves. A runtime serves fixed-shape tensor calls and knows nothing of
requests.
"""
