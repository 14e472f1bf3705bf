"""A stand-in `sglang` package for fast tests: `python -m sglang.launch_server` runs a tiny
HTTP server with SGLang's routes. Put this folder's parent on PYTHONPATH to use it."""
