"""Semantic segmentation from a pretrained MAE encoder (UperNet over the feature pyramid).
Example: python segment.py --config configs/segment/default.yaml

Every key can be set in YAML or on the command line (``--help``, ``--print_config``); evaluate a
trained checkpoint with ``--validate_only true --ckpt_path <run>/checkpoints/last.ckpt``.
"""

from mae.cli.dense import segment_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(segment_main)
