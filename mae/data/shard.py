"""``python -m mae.data.shard ROOT OUT``: an image folder as streaming shards, local or on S3 (see
``mae.data.tools.shard``)."""

from mae.command import run_command
from mae.data.tools.shard import main

if __name__ == "__main__":
    run_command(main)
