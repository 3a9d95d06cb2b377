"""MAE fine-tuning and linear probing. Example: python finetune.py --config configs/finetune/default.yaml

Every key can be set in YAML or on the command line (``--help``, ``--print_config``); evaluate a
fine-tuned checkpoint with ``--validate_only true --ckpt_path <run>/checkpoints/last.ckpt``.
"""

from mae.cli import finetune_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(finetune_main)
