"""The command line: ``python -m cmbench <command> key=value ...``, one module per subcommand."""

from cmbench.cli.main import main

__all__ = ["main"]
