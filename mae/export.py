"""``python -m mae.export CHECKPOINT OUT.safetensors`` (see ``mae.cli.export_main``)."""

from mae.cli import export_main

if __name__ == "__main__":
    export_main()
