"""``python train.py ...``: the same as ``mae pretrain ...`` (``mae pretrain --help``), kept for clones and scripts
that call it."""

from mae.cli import pretrain_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(pretrain_main)
