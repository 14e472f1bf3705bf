"""The load stage: how requests reach an engine. In process: loadgen.py (closed and Poisson
loops, latency from the scheduled send) under the load modes of modes.py. Against a server:
locust.py + locustfile.py (`bench load`), and soak.py (`bench soak`) over the `bench serve`
process of process.py."""
