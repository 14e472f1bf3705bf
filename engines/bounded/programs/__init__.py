"""Graph entry points: nn.Modules whose forward takes only tensors, so that a runtime can run
them eagerly or export and compile them ahead of time. Each calls the one decoder forward
with its own attention and reads what its task needs; none holds request logic.

prefill.py: the scoring prefill (label logits). beam.py: the beam prefill (keeps the prompt
K/V) and the body of one decode step of all beams.
"""
