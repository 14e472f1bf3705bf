"""`bench`: the command line. Each command is a thin layer over library functions; the
commands live by what they drive (run.py, profile.py, serve.py, tools.py), registered on common.app."""
from harness.cli import profile, run, serve, tools  # noqa: F401 - importing a command module registers its commands
from harness.cli.common import app

__all__ = ["app"]  # the console script's entry point (pyproject: bench = "harness.cli:app")
