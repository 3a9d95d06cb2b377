"""``python -m mae.probe``: the same as ``mae probe`` (``mae.cli.probe``), kept for scripts that call it."""

from mae.cli import probe_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(probe_main)
