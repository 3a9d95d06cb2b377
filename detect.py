"""``python detect.py ...``: the same as ``mae detect ...`` (``mae detect --help``), kept for clones and scripts
that call it."""

from mae.cli.dense import detect_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(detect_main)
