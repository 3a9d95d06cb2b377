"""``python -m mae.knn --checkpoint CKPT --data.class_path ...`` (see ``mae.cli.knn``)."""

from mae.cli import knn_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(knn_main)
