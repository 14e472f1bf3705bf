"""The runtimes: planned buffers and compiled graphs, one runtime per task kind.

compiled.py is what both share (the cache key, load-or-compile, the eager fallback, the
warm-up, the status); aot.py the AOTInductor package cache; buffers.py the planned
buffers; prefill.py and beam.py the two runtimes. A runtime serves fixed-shape tensor calls
and knows nothing of requests.
"""
