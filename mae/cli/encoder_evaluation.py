"""What the commands that evaluate a pretrained encoder on a data module (``knn``, ``probe``) share:
their parser's first arguments."""

from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser

from mae.cli.command import command_parser
from mae.cli.command_options import add_option
from mae.convert.sources import FORMATS
from mae.data import ImageDataModule


def encoder_evaluation_parser(prog: str, description: str, data_help: str) -> ArgumentParser:
    """A ``command_parser`` with ``--config`` (a YAML of any of the flags), ``--checkpoint`` and
    ``--checkpoint-format`` (the encoder), ``--data`` (an ``ImageDataModule``: ``--data.class_path`` /
    ``--data.init_args.*``) and ``--device``."""
    parser = command_parser(prog, description)
    parser.add_argument("--config", action=ActionConfigFile, help="Path to a configuration file.")
    add_option(parser, "checkpoint", "the encoder", required=True, type=Path)
    add_option(parser, "checkpoint_format", choices=FORMATS)
    parser.add_argument("--data", type=ImageDataModule, required=True, help=data_help)
    add_option(parser, "device", "where the encoder runs")
    return parser
