"""``python -m mae.anomaly``: the same as ``mae anomaly`` (``mae.cli.anomaly``), kept for scripts that call it."""

from mae.cli import anomaly_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(anomaly_main)
