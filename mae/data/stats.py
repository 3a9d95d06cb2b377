"""``python -m mae.data.stats``: the same as ``mae stats`` (``mae.data.tools.stats``), kept for scripts that call it."""

from mae.command import run_command
from mae.data.tools.stats import main

if __name__ == "__main__":
    run_command(main)
