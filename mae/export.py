"""``python -m mae.export``: the same as ``mae export`` (``mae.cli.export``), kept for scripts that call it."""

from mae.cli import export_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(export_main)
