"""Does MAE pretraining help beyond classification? Detection and segmentation from pretrained encoders
vs the same architecture randomly initialised, on the built-in digit scenes.

For each seed: ``detect.py`` (Mask R-CNN over the feature pyramid; COCO box and mask mAP) and
``segment.py`` (UperNet; mIoU, pixel accuracy) with the recipes ``configs/detect/default.yaml`` and
``configs/segment/default.yaml``, once from each pretrained encoder and once from a random encoder
(``--model.encoder.checkpoint null``), same settings, same budget. Prints a markdown table (mean +- std over
seeds, wall time) and keeps each run's metrics and its last prediction figure. A finished run is recorded
(``OUT/runs/NAME.json``) and reused when the same command line runs again with the same recipe file and
checkpoint bytes, so an interrupted benchmark continues where it stopped and another encoder can join a
finished comparison without rerunning it (a change of this code is not detected: delete ``OUT/runs``).

    mae pretrain --config configs/pretrain/digit_scenes.yaml   # the scenes encoder, once (~10 min)
    mae pretrain --config configs/pretrain/default.yaml        # the single-digit encoder, once (~3 min)
    python benchmarks/transfer.py  # both encoders and random, 3 seeds, both tasks
    python benchmarks/transfer.py --seeds 0 --tasks detect --encoders scenes=path/to/last.ckpt   # one of them

Any checkpoint the pyramid loads can be a row, e.g. the default encoder fine-tuned for classification
(``mae finetune --config configs/finetune/default.yaml``, then
``--encoders digits=runs/pretrain_default/version_0/checkpoints/last.ckpt
finetuned=runs/finetune_default/version_0/checkpoints/last.ckpt``): it tells whether an encoder that knows
the digits helps the detector at all.
"""

import argparse
import csv
import functools
import hashlib
import json
import shutil
import statistics
import time
from pathlib import Path

from mae.cli.main import invoke
from mae.convert.sources import read_checkpoint
from mae.io.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
TASKS = {
    "detect": (
        functools.partial(invoke, "detect"),
        "configs/detect/default.yaml",
        ("val/map", "val/map_50", "val/mask_map"),
    ),
    "segment": (
        functools.partial(invoke, "segment"),
        "configs/segment/default.yaml",
        ("val/miou", "val/acc"),
    ),
}
RANDOM = "random"
DEFAULT_ENCODERS = {
    # configs/pretrain/digit_scenes.yaml
    "scenes": "runs/pretrain_digit_scenes/version_0/checkpoints/last.ckpt",
    # configs/pretrain/default.yaml
    "digits": "runs/pretrain_default/version_0/checkpoints/last.ckpt",
}
# the random encoder's, as pretrained
ENCODER_ARGS = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")


def last_values(metrics_csv: Path, names: tuple[str, ...]) -> dict[str, float]:
    """The last logged value of each of ``names`` in a run's metrics.csv."""
    found: dict[str, float] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            found.update({name: float(row[name]) for name in names if row.get(name)})
    return found


@functools.cache  # an encoder's checkpoint (up to GBs) is read once for all its runs
def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run(args: argparse.Namespace, task: str, init: str, seed: int) -> dict[str, float]:
    """One training run through the task's command line; its final validation metrics and wall time (s)."""
    main, config, names = TASKS[task]
    name = f"{task}_{init}_seed{seed}"
    checkpoint = "null" if init == RANDOM else str(args.encoders[init])
    out = args.out / "runs"
    encoder = {key: args.encoder[key] for key in ENCODER_ARGS}
    argv = [
        "--config",
        str(REPO / config),
        "--seed_everything",
        str(seed),
        "--model.encoder.checkpoint",
        checkpoint,
        "--model.encoder.model_kwargs",
        json.dumps(encoder),
        "--trainer.logger.init_args.save_dir",
        str(out),
        "--trainer.logger.init_args.name",
        name,
        "--trainer.enable_progress_bar",
        "false",
        "--checkpoint.dirpath",
        str(out / name / "checkpoints"),
        "--data.init_args.root",
        str(args.scenes),
        "--data.init_args.num_train",
        str(args.num_train),
        "--data.init_args.num_val",
        str(args.num_val),
        "--trainer.max_epochs",
        str(args.epochs[task]),
        "--figures.every_n_epochs",
        str(args.epochs[task]),
    ]
    record = out / f"{name}.json"  # written after the run: a rerun with the same inputs reuses it
    inputs = {
        "argv": argv,
        "config": sha256_of(REPO / config),
        "checkpoint": init != RANDOM and sha256_of(checkpoint),
    }
    if record.exists() and (done := json.loads(record.read_text())).get("inputs") == inputs:
        print(f"{name}: reusing the finished run recorded in {record}", flush=True)
        return done["result"]
    shutil.rmtree(out / name, ignore_errors=True)
    start = time.perf_counter()
    cli = main(argv)
    seconds = time.perf_counter() - start
    log_dir = Path(cli.trainer.log_dir)
    figure = log_dir / "predictions" / f"epoch_{args.epochs[task]:04d}.png"
    if figure.exists():
        shutil.copy(figure, args.out / f"{name}.png")
    result = {**last_values(log_dir / "metrics.csv", names), "seconds": seconds}
    text = json.dumps({"inputs": inputs, "result": result}, indent=2)
    atomic_write(record, lambda tmp: tmp.write_text(text))
    return result


def summarise(results: dict[str, dict[str, list[dict]]], args: argparse.Namespace) -> str:
    """Markdown table: one row per task and initialisation, mean +- std over seeds."""
    lines = [
        "| task | encoder | "
        + " | ".join(["metric", "mean +- std (%)", "per seed", "minutes per run"])
        + " |",
        "|---|---|---|---:|---|---:|",
    ]
    for task, by_init in results.items():
        for init, runs in by_init.items():
            for metric in TASKS[task][2]:
                values = [100 * r[metric] for r in runs if metric in r]
                if not values:
                    continue
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                minutes = statistics.mean(r["seconds"] for r in runs) / 60
                per_seed = ", ".join(f"{v:.1f}" for v in values)
                lines.append(
                    f"| {task} | {init} | {metric} | {statistics.mean(values):.1f} +- {spread:.1f} | "
                    f"{per_seed} | {minutes:.1f} |"
                )
    return "\n".join(lines)


def named_encoders(specs: list[str] | None, parser: argparse.ArgumentParser) -> dict[str, Path]:
    """``NAME=CHECKPOINT`` arguments as {name: path}; None: ``DEFAULT_ENCODERS``. Every file must exist and
    every encoder have the same shape (the random encoder takes it)."""
    if specs is None:
        specs = [f"{name}={REPO / path}" for name, path in DEFAULT_ENCODERS.items()]
    encoders = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or name == RANDOM or name in encoders:
            parser.error(
                f"--encoders takes distinct NAME=CHECKPOINT pairs (a name other than {RANDOM!r}), got "
                f"{spec!r}"
            )
        if not Path(path).exists():
            parser.error(
                f"--encoders {name}: {path} does not exist; pretrain it first (see this script's docstring)"
            )
        encoders[name] = Path(path)
    shapes = {
        name: {key: read_checkpoint(path).config[key] for key in ENCODER_ARGS}
        for name, path in encoders.items()
    }
    if len({json.dumps(shape, sort_keys=True) for shape in shapes.values()}) > 1:
        parser.error(f"--encoders differ in shape, so one random encoder cannot match them all: {shapes}")
    return encoders


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--encoders",
        nargs="+",
        default=None,
        metavar="NAME=CHECKPOINT",
        help="the pretrained encoders to compare with a random one (default: "
        + ", ".join(f"{n}={c}" for n, c in DEFAULT_ENCODERS.items())
        + ")",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--num-train", type=int, default=400, help="training scenes")
    p.add_argument("--num-val", type=int, default=200, help="validation scenes")
    p.add_argument("--detect-epochs", type=int, default=5)
    p.add_argument("--segment-epochs", type=int, default=10)
    p.add_argument("--scenes", type=Path, default=REPO / "data" / "digit_scenes_transfer")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "transfer_digits")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.encoders = named_encoders(args.encoders, p)
    args.epochs = {"detect": args.detect_epochs, "segment": args.segment_epochs}
    first = next(iter(args.encoders.values()))
    args.encoder = read_checkpoint(first).config  # the random encoder gets the pretrained ones' shape
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[dict]]] = {}
    for task in args.tasks:
        inits = [*args.encoders, RANDOM]
        results[task] = {init: [] for init in inits}
        for seed in args.seeds:
            for init in inits:
                results[task][init].append(run(args, task, init, seed))
                print(f"{task} {init} seed {seed}: {results[task][init][-1]}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    table = summarise(results, args)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    return table


if __name__ == "__main__":
    main()
