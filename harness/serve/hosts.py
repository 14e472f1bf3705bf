"""The loopback names, in one place: the addresses `bench serve` binds without a warning (and
Ray Serve is kept on), and the Host header names it serves by default."""
from __future__ import annotations

LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOOPBACK_HOSTS = tuple(f"[{h}]" if ":" in h else h for h in LOOPBACK)  # as a Host header names them


def is_loopback(host: str) -> bool:
    return host in LOOPBACK
