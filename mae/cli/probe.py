"""``mae probe --checkpoint CKPT --data.class_path ...``: a converged linear probe of a
pretrained encoder on cached features (``mae.eval.probe``), or with ``--head attentive`` an attentive probe
on its cached tokens (``mae.eval.attentive_probe``)."""

from pathlib import Path
from typing import Literal

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import parse_and_run
from mae.cli.command_options import add_option, fraction, non_negative_int, positive_int
from mae.cli.encoder_evaluation import encoder_evaluation_parser
from mae.convert.pooling import blocks_read, default_pool
from mae.errors import ConfigError
from mae.eval import attentive_probe
from mae.eval.attentive_probe import AttentiveProbeResult, AttentiveSettings, evaluate_attentive
from mae.eval.features import Pool, cache_files, is_cache_file, load_encoder
from mae.eval.probe import ProbeResult, ProbeSettings, evaluate
from mae.io.outputs import Output, check_outputs

COMMAND = "mae.probe"


def build_parser() -> ArgumentParser:
    parser = encoder_evaluation_parser(
        "mae probe",
        "A converged linear (or attentive) probe of a pretrained encoder on cached features:",
        "a labelled data module (e.g. ``mae.data.DigitsDataModule``); its training "
        "split trains the heads (a held-out part of it chooses them), its validation split "
        "is scored.",
    )
    parser.add_argument(
        "--head",
        type=Literal["linear", "attentive"],
        default="linear",
        help="linear: softmax-regression heads on pooled features; attentive: one cross-attention layer "
        "with a learned query over the tokens, then a linear layer (V-JEPA's attentive probe).",
    )
    add_option(
        parser,
        "feature_blocks",
        "the attentive head reads the chosen blocks' tokens, concatenated along the feature dimension (a "
        "CNN's: one stage's positions)",
    )
    parser.add_argument(
        "--pool",
        type=Pool | None,
        default=None,
        help='features of the linear head: "cls" token, "avg" of the patch tokens (of a CNN: its last map), '
        'or "both"; default the encoder\'s own: "cls" for a ViT, "avg" for a CNN.',
    )
    parser.add_argument(
        "--views",
        type=positive_int,
        default=1,
        help="views of each training image: 1 = the evaluation view; more = that many with the "
        "data module's training augmentation.",
    )
    parser.add_argument(
        "--lrs",
        type=list[float] | None,
        default=None,
        help="the learning-rate grid (default: linear ``mae.eval.probe.DEFAULT_LRS``, 1e-3 ... 3e-1; "
        "attentive 3e-4, 1e-3, 3e-3).",
    )
    parser.add_argument(
        "--weight-decays",
        type=list[float] | None,
        default=None,
        help="the weight-decay grid (default: linear 0, 1e-4, 1e-3; attentive 1e-3).",
    )
    parser.add_argument(
        "--max-epochs",
        type=positive_int,
        default=None,
        help="cap on the heads' training (default: linear 100; attentive 20, the length of its cosine "
        "learning-rate schedule).",
    )
    parser.add_argument(
        "--patience",
        type=positive_int,
        default=None,
        help="stop after this many epochs in which no head's held-out loss improved (default: linear 10; "
        "attentive 5).",
    )
    parser.add_argument(
        "--attentive-batch-size",
        type=positive_int,
        default=None,
        help=f"the attentive head's training batch (default {attentive_probe.DEFAULT_BATCH_SIZE}).",
    )
    parser.add_argument(
        "--attentive-heads",
        type=positive_int,
        default=None,
        help="the attentive head's attention heads, dividing the tokens' width (default: the encoder's own; "
        "a CNN's: its width / 64).",
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


def run(args: Namespace) -> ProbeResult | AttentiveProbeResult:
    """Print and return the probe's result on the validation split (``mae.eval.probe.evaluate``,
    ``mae.eval.attentive_probe.evaluate_attentive``)."""
    settings = _settings(args)
    if args.cache is not None:
        files = [path for split in ("train", "val") for path in cache_files(f"{args.cache}.{split}")]
        check_outputs(
            COMMAND, [Output(path, "--cache", ours=is_cache_file) for path in files], [args.checkpoint]
        )
    encoder = load_encoder(args.checkpoint, args.data, args.checkpoint_format, args.device)
    blocks = blocks_read(encoder, args.feature_blocks)  # a block the encoder lacks fails before extraction
    if args.head == "attentive":
        result, val_images, train_views = evaluate_attentive(
            encoder, args.data, settings, args.device, args.cache
        )
        tokens, width = result.tokens
        read = f"{tokens} tokens x {width} features of {blocks}"
    else:
        result, val_images, train_views = evaluate(encoder, args.data, settings, args.device, args.cache)
        read = f"{args.pool or default_pool(encoder)} features of {blocks}"
    print(f"{result} on {val_images} validation images, {read}, {train_views} training views")
    return result


def _settings(args: Namespace) -> ProbeSettings | AttentiveSettings:
    """The settings of ``args.head``'s probe: the flags given, the head's own defaults for the others.

    Raises:
        ConfigError: a flag of the other head (``--pool`` for the attentive head, ``--attentive-*`` for the
            linear one).
    """
    shared = dict(
        blocks=args.feature_blocks,
        views=args.views,
        lrs=args.lrs,
        weight_decays=args.weight_decays,
        holdout=args.holdout,
        seed=args.seed,
    )
    given = {
        name: value
        for name, value in (("max_epochs", args.max_epochs), ("patience", args.patience))
        if value is not None
    }
    if args.head == "attentive":
        if args.pool is not None:
            raise ConfigError(
                f"--pool {args.pool} pools the linear head's features; --head attentive pools the tokens "
                "with its own attention: leave --pool out"
            )
        if args.attentive_batch_size is not None:
            given["batch_size"] = args.attentive_batch_size
        return AttentiveSettings(**shared, **given, num_heads=args.attentive_heads)
    for flag, value in (
        ("--attentive-batch-size", args.attentive_batch_size),
        ("--attentive-heads", args.attentive_heads),
    ):
        if value is not None:
            raise ConfigError(
                f"{flag} {value} sets the attentive head; add --head attentive, or leave it out"
            )
    return ProbeSettings(args.pool, **shared, **given)


def main(argv: list[str] | None = None) -> ProbeResult | AttentiveProbeResult:
    return parse_and_run(build_parser(), run, argv, instantiate=True)
