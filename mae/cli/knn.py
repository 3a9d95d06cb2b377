"""``mae knn --checkpoint CKPT --data.class_path ...``: kNN accuracy of a pretrained encoder."""

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import parse_and_run
from mae.cli.command_options import add_option, positive_float
from mae.cli.encoder_evaluation import encoder_evaluation_parser
from mae.convert.pooling import blocks_read
from mae.eval.features import load_encoder
from mae.eval.knn import knn_evaluate


def build_parser() -> ArgumentParser:
    parser = encoder_evaluation_parser(
        "mae knn",
        "kNN accuracy of a pretrained encoder: mae knn --checkpoint CKPT --data.class_path ...",
        "a data module (e.g. ``mae.data.DigitsDataModule``); its train split is the memory bank.",
    )
    add_option(parser, "k", "voters per validation image", default=20)
    add_option(parser, "feature_blocks")
    parser.add_argument(
        "--temperature",
        type=positive_float,
        default=0.07,
        help="vote temperature: each neighbour votes with weight exp(similarity / temperature).",
    )
    return parser


def run(args: Namespace) -> tuple[float, float]:
    """Print and return (top-1 %, top-5 %) on the validation split (``mae.eval.knn.knn_evaluate``)."""
    encoder = load_encoder(args.checkpoint, args.data, args.checkpoint_format, args.device)
    acc1, acc5, queries = knn_evaluate(
        encoder, args.data, args.k, args.temperature, args.device, blocks=args.feature_blocks
    )
    print(
        f"kNN (k={args.k}, T={args.temperature}) on {queries} validation images, "
        f"{blocks_read(encoder, args.feature_blocks)}: top-1 {acc1:.2f}%, top-5 {acc5:.2f}%"
    )
    return acc1, acc5


def main(argv: list[str] | None = None) -> tuple[float, float]:
    return parse_and_run(build_parser(), run, argv, instantiate=True)
