"""What the commands that evaluate a pretrained encoder on a data module (``knn``, ``probe``) share:
their parser's first arguments."""

from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser

from mae.command import command_parser
from mae.data import ImageDataModule


def encoder_evaluation_parser(prog: str, description: str, data_help: str) -> ArgumentParser:
    """A ``command_parser`` with ``--config`` (a YAML of any of the flags), ``--checkpoint`` (the
    encoder) and ``--data`` (an ``ImageDataModule``: ``--data.class_path`` / ``--data.init_args.*``)."""
    parser = command_parser(prog, description)
    parser.add_argument("--config", action=ActionConfigFile, help="Path to a configuration file.")
    parser.add_argument("--checkpoint", type=Path, required=True, help="any source ``mae.load_backbone`` reads.")
    parser.add_argument("--data", type=ImageDataModule, required=True, help=data_help)
    return parser
