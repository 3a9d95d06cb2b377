"""``python -m mae.demo``: the same as ``mae demo`` (``mae.cli.demo``), kept for scripts that call it."""

from mae.cli import demo_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(demo_main)
