"""MAE pretraining. Example: python train.py --config configs/pretrain/default.yaml

Every key can be set in YAML or on the command line (``--help``, ``--print_config``);
resume with ``--ckpt_path <run>/checkpoints/last.ckpt``.
"""

from mae.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
