"""The run stage: a scenario's benchmark end to end. runner.py plans the sweep (sweep.py) and
drives each engine through every cell and load point (engine_run.py), the SLO search
(slo.py) included; preflight.py checks a scenario whole before any engine starts; infer.py
is one engine over a JSONL file; compile.py builds the bounded engine's packages ahead."""
