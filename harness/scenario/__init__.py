"""The scenario stage: a YAML file (files.py) validated into a Scenario (schema.py, from its
sections in fields.py, task.py, load.py, sweep.py), the errors it names (errors.py), and the
engines it drives (engines.py)."""
