"""``mae probe --checkpoint CKPT --data.class_path ...``: a converged linear probe of a
pretrained encoder on cached features (``mae.eval.probe``)."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import parse_and_run
from mae.cli.command_options import fraction, non_negative_int, positive_int
from mae.cli.encoder_evaluation import encoder_evaluation_parser
from mae.convert.pooling import default_pool
from mae.eval.features import Pool, cache_files, is_cache_file, load_encoder
from mae.eval.probe import ProbeResult, ProbeSettings, evaluate
from mae.io.outputs import Output, check_outputs

COMMAND = "mae.probe"


def build_parser() -> ArgumentParser:
    parser = encoder_evaluation_parser(
        "mae probe",
        "A converged linear probe of a pretrained encoder on cached features:",
        "a labelled data module (e.g. ``mae.data.DigitsDataModule``); its training "
        "split trains the heads (a held-out part of it chooses them), its validation split "
        "is scored.",
    )
    parser.add_argument(
        "--pool",
        type=Pool | None,
        default=None,
        help='features: "cls" token, "avg" of the patch tokens (of a CNN: its last map), or "both"; default '
        'the encoder\'s own: "cls" for a ViT, "avg" for a CNN.',
    )
    parser.add_argument(
        "--views",
        type=positive_int,
        default=1,
        help="views of each training image: 1 = the evaluation view; more = that many views with the "
        "data module's training augmentation.",
    )
    parser.add_argument(
        "--lrs",
        type=list[float] | None,
        default=None,
        help="the learning-rate grid (default ``mae.eval.probe.DEFAULT_LRS``, 1e-3 ... 3e-1).",
    )
    parser.add_argument(
        "--weight-decays",
        type=list[float] | None,
        default=None,
        help="the weight-decay grid (default 0, 1e-4, 1e-3).",
    )
    parser.add_argument("--max-epochs", type=positive_int, default=100, help="cap on the heads' training.")
    parser.add_argument(
        "--patience",
        type=positive_int,
        default=10,
        help="stop after this many epochs in which no head's held-out loss improved.",
    )
    parser.add_argument(
        "--holdout",
        type=fraction,
        default=0.1,
        help="fraction of the training split held out to choose the head.",
    )
    parser.add_argument(
        "--cache",
        type=Path | None,
        default=None,
        help="a file prefix to keep the features on disk (memory-mapped) instead of in memory.",
    )
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seed of the held-out split and of the heads' training.",
    )
    return parser


def run(args: Namespace) -> ProbeResult:
    """Print and return the probe's result on the validation split (``mae.eval.probe.evaluate``)."""
    settings = ProbeSettings(
        args.pool,
        args.views,
        args.lrs,
        args.weight_decays,
        args.max_epochs,
        args.patience,
        args.holdout,
        args.seed,
    )
    if args.cache is not None:
        files = [path for split in ("train", "val") for path in cache_files(f"{args.cache}.{split}")]
        check_outputs(
            COMMAND, [Output(path, "--cache", ours=is_cache_file) for path in files], [args.checkpoint]
        )
    encoder = load_encoder(args.checkpoint, args.data, args.checkpoint_format, args.device)
    result, val_images, train_views = evaluate(encoder, args.data, settings, args.device, args.cache)
    pool = args.pool or default_pool(encoder)
    print(f"{result} on {val_images} validation images, {pool} features of {train_views} training views")
    return result


def main(argv: list[str] | None = None) -> ProbeResult:
    return parse_and_run(build_parser(), run, argv, instantiate=True)
