"""``python -m mae.demo --checkpoint CKPT``: the local reconstruction page (see ``mae.cli.demo``)."""

from mae.cli import demo_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(demo_main)
