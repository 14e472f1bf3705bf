"""Shared fixtures: tiny preset model directories (materialised once into the cache)."""
from __future__ import annotations

import pytest

from harness.workload.presets import materialise


@pytest.fixture(scope="session")
def tiny_dir():
    return materialise("tiny")


@pytest.fixture(scope="session")
def tiny_qwen2_dir():
    return materialise("tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_hd32_dir():
    return materialise("tiny-hd32")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from harness.workload.requests import load_tokenizer

    return load_tokenizer(str(tiny_dir))
