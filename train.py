"""MAE pretraining. Example: python train.py --config configs/pretrain/default.yaml

Every key can be set in YAML or on the command line (``--help``, ``--print_config``);
resume with ``--ckpt_path <run>/checkpoints/last.ckpt``.
"""

from mae.cli import pretrain_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(pretrain_main)
