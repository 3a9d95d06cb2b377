"""``python -m mae.export CHECKPOINT OUT.safetensors`` or ``OUT.onnx`` (see ``mae.cli.export``)."""

from mae.cli import export_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(export_main)
