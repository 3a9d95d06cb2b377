"""The checks of ``mae anomaly``'s flags (``mae.cli.anomaly``), run before any file is read or model
loaded: ``resolve_method`` (the method and its defaults, or a saved scorer's, refusing what it fixes) and
``check_args`` (each number's range and what each method needs)."""

from argparse import Namespace

from mae.apps.anomaly.methods import FEATURES, KNN_PATCH_SIZE, MAE, PIXEL_KNN
from mae.apps.anomaly.saved_scorer import SavedScorer, load_scorer
from mae.errors import UsageError

DEFAULTS = {"mask_ratio": 0.75, "repeats": 1, "seed": 0}  # of the flags a saved scorer fixes
FEATURE_FLAGS = ("feature_blocks", "neighbourhood", "coreset_fraction")
FIXED = {  # what a saved scorer of each method fixes: flags refused with --scorer
    MAE: ("mask_ratio", "repeats", "seed", "raw_errors", "top_k"),
    PIXEL_KNN: ("patch_size", "seed", "top_k"),
    FEATURES: (*FEATURE_FLAGS, "seed", "top_k"),
}


def resolve_method(args: Namespace) -> SavedScorer | None:
    """Resolve the method and its defaults: with --scorer, from the scorer's record (read here, before any
    other work), refusing flags that would fit or change it; else --method's (default mae).

    Raises:
        UsageError: --scorer with --normal, --save-scorer, another --method or a setting the scorer fixes;
            a features flag with another method.
        MissingFileError, InputError: no scorer there, or not a readable one (``load_scorer``).
    """
    if args.scorer is None:
        args.method = args.method or MAE
        if args.method != FEATURES:
            given = [f for f in FEATURE_FLAGS if getattr(args, f) is not None]
            if given:
                flag = given[0].replace("_", "-")
                raise UsageError(
                    f"--{flag} is for --method {FEATURES}; leave it out with --method {args.method}"
                )
        if args.top_k is None:
            args.top_k = 1 if args.method == FEATURES else 4
        for flag, default in DEFAULTS.items():
            setattr(args, flag, default if getattr(args, flag) is None else getattr(args, flag))
        return None
    for flag, given in (("--normal", args.normal), ("--save-scorer", args.save_scorer)):
        if given is not None:
            raise UsageError(
                f"--scorer {args.scorer} is fitted already: leave out {flag} (fit a new scorer without "
                "--scorer)"
            )
    saved = load_scorer(args.scorer)
    method = saved.record["method"]
    if args.method not in (None, method):
        raise UsageError(f"--scorer {args.scorer} is a scorer of --method {method}, not {args.method}")
    for flag in FIXED[method]:
        if getattr(args, flag) not in (None, False):  # given (--raw-errors: False unless given)
            raise UsageError(
                f"--{flag.replace('_', '-')} is fixed by --scorer {args.scorer} "
                f"({saved.record['settings'][flag]}); leave it out"
            )
    args.method = method
    for flag, default in DEFAULTS.items():  # the scorer's where it records them
        setattr(args, flag, saved.record["settings"].get(flag, default))
    args.top_k = saved.record["settings"]["top_k"]
    return saved


def check_args(args: Namespace) -> None:
    if not 0 < args.mask_ratio < 1:  # NaN fails this too
        raise UsageError(
            f"--mask-ratio must be in (0, 1), the fraction of patches each mask hides; got {args.mask_ratio}"
        )
    for flag in ("repeats", "top_k", "batch_size"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    for flag in ("img_size", "patch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(
                f"--{flag.replace('_', '-')} must be a positive number of pixels, got {getattr(args, flag)}"
            )
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    _check_decision(args)
    if args.method == FEATURES:
        _check_features(args)
    elif args.method == PIXEL_KNN:
        _check_pixel_knn(args)
    else:
        _check_mae(args)


def _check_mae(args: Namespace) -> None:
    if args.checkpoint is None and args.scorer is None:
        raise UsageError(
            f"--method {MAE} needs --checkpoint, an MAE with its decoder (or --method {PIXEL_KNN}, "
            f"the baseline that needs none)"
        )
    if args.patch_size is not None:
        raise UsageError(f"--patch-size is for --method {PIXEL_KNN}; the MAE's patches are its checkpoint's")
    if args.normal is None and not args.raw_errors and args.scorer is None:
        raise UsageError(
            "give --normal, a folder of defect-free images whose errors standardise the test errors, "
            "or --raw-errors to score the errors as they are"
        )


def _check_decision(args: Namespace) -> None:
    if not 0 <= args.holdout < 1:  # NaN fails this too
        raise UsageError(
            f"--holdout must be in [0, 1), the fraction of the --normal images held out for the threshold "
            f"(0: none); got {args.holdout}"
        )
    if not 0 <= args.threshold_quantile <= 1:
        raise UsageError(
            f"--threshold-quantile must be in [0, 1], the quantile of the held-out normal images' scores "
            f"taken as the threshold (1: their maximum); got {args.threshold_quantile}"
        )


def _check_pixel_knn(args: Namespace) -> None:
    if args.checkpoint is not None:
        raise UsageError(
            f"--method {PIXEL_KNN} uses no checkpoint: leave out --checkpoint (give --img-size, and "
            f"--mean / --std for other statistics than ImageNet's)"
        )
    if args.mean is not None and len(args.mean) != len(args.std):
        raise UsageError(
            f"--mean and --std need one value per channel each; got {len(args.mean)} and {len(args.std)}"
        )
    if args.scorer is not None:  # its images, size and patch are the scorer's
        return
    if args.normal is None:
        raise UsageError(
            f"--method {PIXEL_KNN} needs --normal: the defect-free images each test image is compared with"
        )
    if args.img_size is None:
        raise UsageError(
            f"--method {PIXEL_KNN} needs --img-size: the size the images are compared at (there is no "
            f"checkpoint to give it)"
        )
    patch = args.patch_size or KNN_PATCH_SIZE
    if args.img_size % patch:
        raise UsageError(
            f"--img-size {args.img_size} is not a multiple of the patch size {patch}: choose "
            f"--patch-size to divide it"
        )


def _check_features(args: Namespace) -> None:
    if args.checkpoint is None and args.scorer is None:
        raise UsageError(
            f"--method {FEATURES} needs --checkpoint, the encoder whose patch tokens are compared (any "
            "checkpoint mae embed reads), or --scorer, a saved scorer"
        )
    if args.normal is None and args.scorer is None:
        raise UsageError(
            f"--method {FEATURES} needs --normal, the defect-free images whose patch features make the "
            "memory bank (or --scorer, a saved scorer)"
        )
    if args.mean is not None and len(args.mean) != len(args.std):
        raise UsageError(
            f"--mean and --std need one value per channel each; got {len(args.mean)} and {len(args.std)}"
        )
    for flag in ("patch_size", "raw_errors"):
        if getattr(args, flag):
            raise UsageError(
                f"--{flag.replace('_', '-')} is not for --method {FEATURES}: the patches are the encoder's, "
                "the scores distances to normal features"
            )
    if args.neighbourhood is not None and (args.neighbourhood < 1 or args.neighbourhood % 2 == 0):
        raise UsageError(
            f"--neighbourhood must be an odd number of patches (1: none, 3: PatchCore's), got "
            f"{args.neighbourhood}"
        )
    if args.coreset_fraction is not None and not 0 < args.coreset_fraction <= 1:
        raise UsageError(
            "--coreset-fraction must be in (0, 1], the fraction of the normal patch vectors kept in the "
            f"bank (1: all); got {args.coreset_fraction}"
        )
