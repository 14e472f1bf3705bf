"""bounded-bench harness: scenario -> workload -> load -> engines -> metrics -> reports."""

__version__ = "0.1.0"
