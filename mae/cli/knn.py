"""``python -m mae.knn --checkpoint CKPT --data.class_path ...``: kNN accuracy of a pretrained encoder."""

from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from mae.command import command_parser, parse_and_run
from mae.data import ImageDataModule
from mae.eval.features import load_encoder
from mae.eval.knn import knn_evaluate


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "python -m mae.knn",
        "kNN accuracy of a pretrained encoder: ``python -m mae.knn --checkpoint CKPT --data.class_path ...``.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="Path to a configuration file.")
    parser.add_argument("--checkpoint", type=Path, required=True, help="any source ``mae.load_backbone`` reads.")
    parser.add_argument("--data", type=ImageDataModule, required=True,
                        help="a data module (e.g. ``mae.data.DigitsDataModule``); its train split is the "
                        "memory bank.")  # fmt: skip
    parser.add_argument("--k", type=int, default=20, help="neighbours.")
    parser.add_argument("--temperature", type=float, default=0.07, help="vote temperature.")
    parser.add_argument("--checkpoint_format", type=str, default="auto", help='"auto" or a format name.')
    parser.add_argument("--device", type=str, default="cpu", help="where to run the encoder.")
    return parser


def run(args: Namespace) -> tuple[float, float]:
    """Print and return (top-1 %, top-5 %) on the validation split (``mae.eval.knn.knn_evaluate``)."""
    encoder = load_encoder(args.checkpoint, args.data, args.checkpoint_format, args.device)
    acc1, acc5, queries = knn_evaluate(encoder, args.data, args.k, args.temperature, args.device)
    print(f"kNN (k={args.k}, T={args.temperature}) on {queries} validation images: top-1 {acc1:.2f}%, "
          f"top-5 {acc5:.2f}%")  # fmt: skip
    return acc1, acc5


def main(argv: list[str] | None = None) -> tuple[float, float]:
    return parse_and_run(build_parser(), run, argv, instantiate=True)
