"""`python -m harness.cli`: the same as `bench`."""
from harness.cli import app

app()
