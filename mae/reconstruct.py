"""``python -m mae.reconstruct --checkpoint CKPT IMAGE_OR_FOLDER...`` (see ``mae.cli.reconstruct``)."""

from mae.cli import reconstruct_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(reconstruct_main)
