"""``python -m mae.embed``: the same as ``mae embed`` (``mae.cli.embed``), kept for scripts that call it."""

from mae.cli import embed_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(embed_main)
