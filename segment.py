"""``python segment.py ...``: the same as ``mae segment ...`` (``mae segment --help``), kept for clones and scripts
that call it."""

from mae.cli.dense import segment_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(segment_main)
