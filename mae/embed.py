"""``python -m mae.embed --checkpoint CKPT ROOT_OR_FILES... --out FILE`` (see ``mae.cli.embed``)."""

from mae.cli import embed_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(embed_main)
