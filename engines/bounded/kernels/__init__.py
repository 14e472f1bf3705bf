"""Tensor kernels of the bounded engine: pure functions over tensors (no modules, no request
logic), written so that eager mode and torch.export/Inductor both handle them.

dense.py (norms, rotary embedding, GEMMs), attention.py (packed causal attention of the
prefill), query_attention.py (a query's items against its shared K/V plus their own
tokens), beam_attention.py (shared-prefix attention of a decode step), partial.py (the
partial softmaxes and log-sum-exp merge those two share), head.py (the full-vocabulary head
of a beam step), select.py (choosing the next beams), constraints.py (item-code tries).
"""
