"""``python -m mae.data.stats ROOT``: per-channel mean and std of an image folder (see
``mae.data.tools.stats``)."""

from mae.command import run_command
from mae.data.tools.stats import main

if __name__ == "__main__":
    run_command(main)
