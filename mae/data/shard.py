"""``python -m mae.data.shard``: the same as ``mae shard`` (``mae.data.tools.shard``), kept for scripts that call it."""

from mae.command import run_command
from mae.data.tools.shard import main

if __name__ == "__main__":
    run_command(main)
