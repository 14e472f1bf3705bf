"""The tasks: what the engine serves, one file per task kind. Each task is a static DAG of
stages (dag.py) over typed stage data -- request-scope nodes run once per business
request, batch-scope nodes once per merged batch -- and a batching rule for the batcher
(batcher.py). base.py is what the task kinds share; prefill.py and beam.py are the kinds.
"""
