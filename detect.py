"""Object detection / instance segmentation from a pretrained MAE encoder (ViTDet's simple feature
pyramid under torchvision's Mask R-CNN, Faster R-CNN or RetinaNet).
Example: python detect.py --config configs/detect/default.yaml

Every key can be set in YAML or on the command line (``--help``, ``--print_config``); evaluate a
trained checkpoint with ``--validate_only true --ckpt_path <run>/checkpoints/last.ckpt``.
"""

from mae.cli.dense import detect_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(detect_main)
