"""Inference engines behind one interface (see `engines.base`), looked up by name in `engines.registry`."""
