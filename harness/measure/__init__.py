"""The measure stage, the same code for every engine: request records (records.py) become
latency, throughput and effective MFU (metrics.py, from flops.py), and answers become
agreement and beam recall between engines (agreement.py)."""
