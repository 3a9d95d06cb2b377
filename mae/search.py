"""``python -m mae.search``: the same as ``mae search`` (``mae.cli.search``), kept for scripts that call it."""

from mae.cli import search_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(search_main)
