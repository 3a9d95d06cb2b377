"""``python -m mae.probe --checkpoint CKPT --data.class_path ...`` (see ``mae.cli.probe``)."""

from mae.cli import probe_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(probe_main)
