"""``python -m mae.anomaly --checkpoint C --normal ROOT --test ROOT --out DIR`` (see ``mae.cli.anomaly``)."""

from mae.cli import anomaly_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(anomaly_main)
