"""``python -m mae.reconstruct``: the same as ``mae reconstruct`` (``mae.cli.reconstruct``), kept for scripts
that call it."""

from mae.cli import reconstruct_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(reconstruct_main)
