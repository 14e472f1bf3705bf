"""The workload stage: the model a scenario names (presets.py: materialised or resolved) and
the requests it sends (requests.py: synthetic from the seed, or a JSONL dataset)."""
