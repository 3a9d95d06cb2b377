"""``python -m mae.knn``: the same as ``mae knn`` (``mae.cli.knn``), kept for scripts that call it."""

from mae.cli import knn_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(knn_main)
