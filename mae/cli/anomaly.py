"""``mae anomaly --checkpoint C --normal ROOT --test ROOT --out DIR``: anomaly scores and heat maps, and
AUROC / AUPRO when the test folder is labelled (MVTec AD layout), by any scorer of the table
``mae.apps.anomaly.scorers.SCORERS`` (``--method``: an MAE's reconstruction error, the default; the
pixel-kNN baseline; a memory of the encoder's patch features, PatchCore). ``--save-scorer`` / ``--scorer``
keep a fitted scorer and apply it later without ``--normal``.

Parse, then one call: ``mae.apps.anomaly.detection.detect``. The flags are declared where what they set
lives: each scorer's are its settings' (``Scorer.options``), the decision's ``decision.OPTIONS``, the run's
``detection.OPTIONS``; their checks are there too. This module adds them and the shared options."""

from argparse import Namespace

from jsonargparse import ArgumentParser

from mae.apps.anomaly.detection import OPTIONS, AnomalyRun, detect
from mae.apps.anomaly.evaluation import AnomalyResult
from mae.apps.anomaly.scorers import SCORERS
from mae.apps.anomaly.scorers.base import ModelInputs, Option, Reading
from mae.apps.anomaly.scorers.choice import choose_scorer, option_names, saved_scorer_choice
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import (
    DECODER_CHECKPOINT,
    SHARED_OPTIONS,
    add_checkpoint,
    add_option,
    argparse_float,
    argparse_int,
)
from mae.convert.sources import FORMATS

TYPES = {int: argparse_int, float: argparse_float}  # read as argparse reads numbers (nan, inf included)
SHARED = {  # the shared options (their values checked by the parser) and what they are here
    "device": "where the model runs",
    "img_size": "pixel-knn: required",
    "mean": "pixel-knn: ImageNet's, RGB",
    "std": "pixel-knn: ImageNet's, RGB",
    "max_image_pixels": "",
}
RUN_FIELDS = ("test", "out", "normal", "ground_truth", "validation", "save_scorer", "figures", "holdout")


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae anomaly",
        "Score test images for anomalies and write scores, heat maps and, for a labelled test folder "
        "(MVTec AD layout), image AUROC, pixel AUROC and AUPRO; decide which are anomalous at a threshold "
        "chosen on held-out normal images or a validation folder. --method mae (the default): an MAE's "
        "reconstruction error, every patch hidden by complementary masks and rebuilt from its context; "
        "pixel-knn: the baseline, no checkpoint; features: PatchCore on the encoder's patch tokens.",
    )
    add_checkpoint(parser, FORMATS, f"mae: {DECODER_CHECKPOINT}; features: any", default=None)
    add_option(parser, "out", "output folder", required=True)
    add_option(parser, "batch_size", default=32)
    for name, help in SHARED.items():
        add_option(parser, name, help)
    for option in OPTIONS:
        _add(parser, option)
    for scorer in SCORERS.values():
        group = parser.add_argument_group(f"--method {scorer.name}")
        for option in scorer.options():
            _add(group, option)
    return parser


def _add(parser: ArgumentParser, option: Option) -> None:
    """``option`` as an argument of ``parser`` (or of a group); one every command shares
    (``--feature-blocks``) through ``add_option``, its help the scorer's own words."""
    if option.name in SHARED_OPTIONS:
        add_option(parser, option.name, option.help, default=option.default)
        return
    if option.kind is bool:
        parser.add_argument(option.flag, action="store_true", help=option.help)
        return
    kwargs = {"nargs": "+"} if option.many else {}
    kwargs.update(
        {"choices": option.choices} if option.choices else {"type": TYPES.get(option.kind, option.kind)}
    )
    parser.add_argument(
        option.flag, default=option.default, required=option.required, help=option.help, **kwargs
    )


def run(args: Namespace) -> AnomalyResult:
    """Choose the scorer (``--method``'s, or ``--scorer``'s), then ``detect``: scores, figures, metrics
    and the decision.

    Raises:
        UsageError: a bad number, a flag the scorer needs missing or one it cannot use given (another
            scorer's, or with --scorer one it fixes or one that would refit it).
        ConfigError, InputError, OutputError: as ``detect``.
    """
    options = {name: getattr(args, name) for name in option_names()}
    if args.scorer is None:
        choice = choose_scorer(args.method, options)
    else:
        refitting = {"--normal": args.normal, "--save-scorer": args.save_scorer}
        choice = saved_scorer_choice(args.scorer, args.method, options, refitting)
    reading = Reading(args.device, args.batch_size, args.max_image_pixels, args.checkpoint_format)
    inputs = ModelInputs(args.checkpoint, args.img_size, args.mean, args.std)
    given = {name: getattr(args, name) for name in RUN_FIELDS}
    quantile = args.threshold_quantile
    return detect(AnomalyRun(choice, **given, threshold_quantile=quantile, inputs=inputs, reading=reading))


def main(argv: list[str] | None = None) -> AnomalyResult:
    return parse_and_run(build_parser(), run, argv)
