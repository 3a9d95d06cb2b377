"""``python finetune.py ...``: the same as ``mae finetune ...`` (``mae finetune --help``), kept for clones and scripts
that call it."""

from mae.cli import finetune_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(finetune_main)
