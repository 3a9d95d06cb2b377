"""Time to quality: the encoder each pretraining variant (the decoder switches, low and progressive
resolution) gives within the same wall-clock budget as the paper's default recipe.

For each seed, every variant pretrains with the default job's recipe (``configs/pretrain/default.yaml``:
model, mask ratio, lr, batch, epochs) changed only by its switches; the model is saved after every
epoch with the training wall time reached (validation off, the saves not counted). Each budget (25 /
50 / 100 % of the default recipe's pretraining time in the same seed) is given the last checkpoint the
variant reached within it, evaluated at the full image size with kNN (k=20) and the fast linear probe
(cls token) as benchmarks/quality.py does; so is each variant's last checkpoint. Also per variant: the
analytic FLOPs per training step (``mae/models/flops.py``) and the training throughput (images/s over
the whole run, loader included). Writes ``results.json``, ``table.md`` (mean ± std over seeds) and
``accuracy_vs_time.png``.

    python benchmarks/time_to_quality.py \\
        --out benchmarks/results/time_to_quality_digits                         # every variant, 3 seeds
    python benchmarks/time_to_quality.py --variants default fast --seeds 0      # a quicker look
    python benchmarks/time_to_quality.py --data imagefolder --root /data/mine --img-size 64
    python benchmarks/time_to_quality.py --throughput-only --device cuda --model mae_vit_base_patch16 \\
        --img-size 224 --batch-size 256 --json variants.json                    # step throughput alone

Variants: ``default`` (the paper), ``partial-0.25`` / ``partial-0.5`` (``decoder_keep_ratio``),
``cross`` (``decoder_type: cross``), ``cross-partial-0.25``, ``low-res`` (pretraining at half the image
side, ``configs/pretrain/default_lowres.yaml``), ``fast`` (``configs/pretrain/default_fast.yaml``),
``progressive`` (half the side for 80 % of the epochs, then the full one,
``configs/pretrain/default_progressive.yaml``) and ``progressive-0.6`` (the full side from 60 % on).
"""

import argparse
import json
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from harness import mean_std, quiet_trainer

from mae.convert.backbone import load_backbone
from mae.data import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from mae.eval.knn import knn_evaluate
from mae.eval.probe import ProbeSettings, evaluate
from mae.models import create_model
from mae.models.flops import mae_train_flops
from mae.training.optim import weight_decay_groups
from mae.training.pretrain import MAEPretrainModule
from mae.training.runtime import set_attention_kernel, training_settings

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "pretrain" / "default.yaml"
FEATURE_BATCH = 256  # images per forward pass when extracting frozen features


@dataclass(frozen=True)
class Variant:
    """Decoder switches (``MAEPretrainModule`` arguments) and the pretraining image side as a fraction
    of the full one (rounded to whole patches; the encoder is evaluated at the full size)."""

    switches: dict = field(default_factory=dict)
    resolution: float = 1.0
    # Progressive resolution (model.resolution_schedule): (start fraction of the epochs, image side as a
    # fraction of the full one) per phase, the last at 1.0; the run is built, evaluated
    # and saved at the full size.
    phases: tuple[tuple[float, float], ...] = ()


VARIANTS = {
    "default": Variant(),
    "partial-0.25": Variant({"decoder_keep_ratio": 0.25}),
    "partial-0.5": Variant({"decoder_keep_ratio": 0.5}),
    "cross": Variant({"decoder_type": "cross"}),
    "cross-partial-0.25": Variant({"decoder_type": "cross", "decoder_keep_ratio": 0.25}),
    "low-res": Variant(resolution=0.5),  # configs/pretrain/default_lowres.yaml
    # default_fast.yaml
    "fast": Variant({"decoder_type": "cross", "decoder_keep_ratio": 0.5}, resolution=0.75),
    "progressive": Variant(phases=((0.0, 0.5), (0.8, 1.0))),  # configs/pretrain/default_progressive.yaml
    "progressive-0.6": Variant(phases=((0.0, 0.5), (0.6, 1.0))),  # 40 % of the epochs at the full size
}


def pretrain_size(full: int, patch: int, resolution: float) -> int:
    """The pretraining image side: ``full * resolution`` rounded to whole patches (at least one)."""
    return max(patch, round(full * resolution / patch) * patch)


def recipe(args: argparse.Namespace) -> dict:
    """The default job's ``model`` section, batch size and epochs, with the command line's overrides."""
    config = yaml.safe_load(RECIPE.read_text())
    model = dict(config["model"])
    if args.model is not None:
        model.update(model=args.model, model_kwargs={})
    if args.model_kwargs is not None:
        model["model_kwargs"] = args.model_kwargs
    epochs = args.epochs or config["trainer"]["max_epochs"]
    optim = model["optim"]  # a shorter run keeps a warmup that fits
    optim["warmup_epochs"] = min(optim["warmup_epochs"], epochs / 4)
    return {
        "model": model,
        "batch_size": args.batch_size or config["data"]["init_args"]["batch_size"],
        "epochs": epochs,
    }


def make_data(args: argparse.Namespace, img_size: int, augmentation: str, batch_size: int) -> ImageDataModule:
    common = dict(
        img_size=img_size, batch_size=batch_size, num_workers=args.workers, augmentation=augmentation
    )
    if args.data == "digits":
        return DigitsDataModule(**common)
    if args.data == "imagefolder":
        return ImageFolderDataModule(args.root, **common)
    return CIFARDataModule(args.root, dataset=args.data, **common)


class EpochSnapshots(pl.Callback):
    """After every training epoch: the training wall time so far (these saves left out) and the model,
    saved where ``load_backbone`` reads it; counts the images trained on."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.rows, self.images = folder, [], 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start, self.excluded = time.perf_counter(), 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.images += batch[0].shape[0]

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        path = self.folder / f"epoch_{trainer.current_epoch + 1:04d}.ckpt"
        trainer.save_checkpoint(path, weights_only=True)
        self.rows.append(
            {
                "epoch": trainer.current_epoch + 1,
                "elapsed_s": now - self.start - self.excluded,
                "path": str(path),
            }
        )
        self.excluded += time.perf_counter() - now


def _patch_size(model: dict) -> int:
    with torch.device("meta"):
        return create_model(model["model"], **model["model_kwargs"]).patch_size


def pretrain(args: argparse.Namespace, name: str, seed: int, out: Path) -> dict:
    """Pretrain variant ``name`` for the recipe's epochs; its sizes, speed and per-epoch snapshots."""
    settings, variant = recipe(args), VARIANTS[name]
    pl.seed_everything(seed)
    patch = _patch_size(settings["model"])
    size = pretrain_size(args.img_size, patch, variant.resolution)
    switches = dict(variant.switches)
    if variant.phases:
        switches["resolution_schedule"] = [
            [start, pretrain_size(args.img_size, patch, r)] for start, r in variant.phases
        ]
    module = MAEPretrainModule(img_size=size, **{**settings["model"], **switches})
    snapshots = EpochSnapshots(out / "snapshots")
    trainer = quiet_trainer(out, [snapshots], max_epochs=settings["epochs"])
    trainer.fit(module, datamodule=make_data(args, size, "pretrain", settings["batch_size"]))
    wall = snapshots.rows[-1]["elapsed_s"]
    shown = "->".join(str(side) for _, side in switches["resolution_schedule"]) if variant.phases else size
    return {
        "img_size": shown,
        "epochs": len(snapshots.rows),
        "steps": trainer.global_step,
        "wall_s": wall,
        "images_per_s": snapshots.images / wall,
        "gflops_per_step": module.flops_per_batch / 1e9,
        "snapshots": snapshots.rows,
    }


def evaluate_checkpoint(args: argparse.Namespace, path: str, seed: int) -> dict[str, float]:
    """kNN and fast linear-probe top-1 % of the encoder in ``path``, at the full image size."""
    encoder = load_backbone(path, img_size=args.img_size).eval()
    data = make_data(args, args.img_size, "none", FEATURE_BATCH)
    pl.seed_everything(seed)
    knn = knn_evaluate(encoder, data)[0]
    probe = evaluate(encoder, data, ProbeSettings(seed=seed, max_epochs=args.probe_max_epochs))[0].val_acc1
    return {"knn": knn, "probe": probe}


def reached(snapshots: list[dict], budget_s: float) -> dict | None:
    """The last snapshot taken within ``budget_s`` seconds of training, or None."""
    within = [s for s in snapshots if s["elapsed_s"] <= budget_s]
    return within[-1] if within else None


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, dict]:
    out = args.out / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    runs = {}
    for name in args.variants:  # "default" first: its time sets the budgets
        runs[name] = pretrain(args, name, seed, out / name)
        evaluate_run(args, runs[name], runs["default"]["wall_s"], seed)
        if not args.keep_checkpoints:
            shutil.rmtree(out / name / "snapshots", ignore_errors=True)
    return runs


def evaluate_run(args: argparse.Namespace, run: dict, default_s: float, seed: int) -> None:
    """Add to ``run`` the scores of the checkpoint each budget (a fraction of ``default_s``) reaches
    (``budgets``, None where none) and of its last one (``final``), each checkpoint evaluated once."""
    evaluated: dict[str, dict] = {}

    def scores(snapshot: dict) -> dict:
        if snapshot["path"] not in evaluated:
            evaluated[snapshot["path"]] = evaluate_checkpoint(args, snapshot["path"], seed)
        return {"epoch": snapshot["epoch"], "elapsed_s": snapshot["elapsed_s"], **evaluated[snapshot["path"]]}

    run["budgets"] = {}
    for fraction in args.budgets:
        snapshot = reached(run["snapshots"], fraction * default_s)
        run["budgets"][str(fraction)] = None if snapshot is None else scores(snapshot)
    run["final"] = scores(run["snapshots"][-1])


def _at(runs: list[dict], budget: str, metric: str) -> list[float | None]:
    return [None if r["budgets"][budget] is None else r["budgets"][budget][metric] for r in runs]


def summarise(args: argparse.Namespace, per_seed: list[dict]) -> str:
    budgets = [str(f) for f in args.budgets]
    pct = [f"{float(b) * 100:g} %" for b in budgets]
    head = ["variant", "pretrain px", "pretraining s", "GFLOP/step", "img/s"]
    head += (
        [f"probe @ {p}" for p in pct] + [f"kNN @ {p}" for p in pct] + ["probe at its end", "kNN at its end"]
    )
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name in args.variants:
        runs = [seed[name] for seed in per_seed]
        cells = [
            name,
            str(runs[0]["img_size"]),
            mean_std([r["wall_s"] for r in runs]),
            mean_std([r["gflops_per_step"] for r in runs], 2),
            mean_std([r["images_per_s"] for r in runs], 0),
        ]
        cells += [mean_std(_at(runs, b, "probe")) for b in budgets] + [
            mean_std(_at(runs, b, "knn")) for b in budgets
        ]
        cells += [mean_std([r["final"]["probe"] for r in runs]), mean_std([r["final"]["knn"] for r in runs])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", verdict(args, per_seed)]
    return "\n".join(lines)


def verdict(args: argparse.Namespace, per_seed: list[dict]) -> str:
    """Which variants reach the default recipe's final probe accuracy (within 0.5 points) within half
    its time, or how close each came (means over seeds)."""
    target = statistics.mean(seed["default"]["final"]["probe"] for seed in per_seed)
    half = [b for b in args.budgets if b <= 0.5]
    if not half:
        return f"The default recipe's linear probe: {target:.1f} %."
    budget = str(max(half))
    gaps = {}
    for name in args.variants:
        values = [seed[name]["budgets"][budget] for seed in per_seed]
        if name != "default" and all(v is not None for v in values):
            gaps[name] = statistics.mean(v["probe"] for v in values) - target
    hits = [f"{n} ({g:+.1f})" for n, g in gaps.items() if g >= -0.5]
    closest = ", ".join(f"{n} {g:+.1f}" for n, g in sorted(gaps.items(), key=lambda kv: -kv[1]))
    share = f"{float(budget) * 100:g} % of its time"
    if hits:
        return (
            f"Within 0.5 points of the default recipe's final linear probe ({target:.1f} %) in {share}: "
            f"{', '.join(hits)}."
        )
    return (
        f"No variant reaches the default recipe's final linear probe ({target:.1f} %) within 0.5 points in "
        f"{share}; points from it there: {closest or 'no variant had a checkpoint by then'}."
    )


def plot(args: argparse.Namespace, per_seed: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for name in args.variants:
        runs = [seed[name] for seed in per_seed]
        points = [[r["budgets"][str(b)] for r in runs] for b in args.budgets] + [[r["final"] for r in runs]]
        points = [p for p in points if all(v is not None for v in p)]
        xs = [statistics.mean(v["elapsed_s"] for v in p) for p in points]
        for ax, metric in zip(axes, ("probe", "knn"), strict=True):
            ax.plot(xs, [statistics.mean(v[metric] for v in p) for p in points], marker="o", label=name)
    for ax, title in zip(axes, ("fast linear probe", "kNN (k=20)"), strict=True):
        ax.set(xlabel="pretraining wall time (s)", ylabel="top-1 %", title=title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "accuracy_vs_time.png", dpi=120)


def step_throughput(args: argparse.Namespace) -> list[dict]:
    """Training-step images/s of every variant on one fixed batch (forward, backward, AdamW), rounds
    interleaved (the order rotating), with ``train.py``'s settings for the device, not compiled."""
    device = torch.device(args.device)
    settings = training_settings(device, steps=0)  # a short run: no compilation
    model_settings = recipe(args)["model"]
    steps = {}
    for name in args.variants:
        variant = VARIANTS[name]
        if variant.phases:
            print(f"{name}: left out of the step throughput (its steps are those of its phases' sizes)")
            continue
        torch.manual_seed(0)
        size = pretrain_size(args.img_size, _patch_size(model_settings), variant.resolution)
        model = (
            create_model(
                model_settings["model"],
                img_size=size,
                norm_pix_loss=True,
                **model_settings["model_kwargs"],
                **variant.switches,
            )
            .to(device)
            .train()
        )
        set_attention_kernel(model, settings.attention)
        optimizer = torch.optim.AdamW(
            weight_decay_groups(model, 0.05), lr=1e-4, betas=(0.9, 0.95), fused=settings.fused_adamw
        )
        imgs = torch.randn(args.batch_size or 64, 3, size, size, device=device)
        steps[name] = (
            _training_step(model, optimizer, imgs, settings.precision == "bf16", device),
            mae_train_flops(model, imgs.shape[0]),
            size,
        )
        for _ in range(args.warmup):
            steps[name][0]()
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):
        order = list(steps)[r % len(steps) :] + list(steps)[: r % len(steps)]
        for name in order:
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name][0]()
            _sync(device)
            timings[name].append((time.perf_counter() - start) / args.steps)
    rows = []
    for name, (_, flops, size) in steps.items():
        seconds = statistics.median(timings[name])
        batch = args.batch_size or 64
        rows.append(
            {
                "variant": name,
                "model": model_settings["model"],
                "img_size": size,
                "batch_size": batch,
                "settings": settings.describe(),
                "img_s": batch / seconds,
                "gflops_per_step": flops / 1e9,
                "tflops": flops / seconds / 1e12,
            }
        )
        print(
            f"{name:20s} {size:4d} px  {batch / seconds:9.1f} img/s  {flops / 1e9:9.2f} GFLOP/step  "
            f"{flops / seconds / 1e12:7.2f} TFLOP/s  ({settings.describe()})",
            flush=True,
        )
    return rows


def _training_step(model, optimizer, imgs, bf16: bool, device: torch.device):
    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(imgs, 0.75)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=[0.25, 0.5, 1.0],
        help="fractions of the default recipe's pretraining time",
    )
    p.add_argument("--data", default="digits", choices=["digits", "imagefolder", "cifar10", "cifar100"])
    p.add_argument("--root", default="data")
    p.add_argument(
        "--img-size", type=int, default=32, help="the full image side (evaluation, and the default's)"
    )
    p.add_argument("--model", default=None, help="a registered model instead of the default job's")
    p.add_argument("--model-kwargs", type=json.loads, default=None, help="JSON; default: the default job's")
    p.add_argument("--batch-size", type=int, default=None, help="default: the default job's (64)")
    p.add_argument("--epochs", type=int, default=None, help="default: the default job's (30)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--probe-max-epochs", type=int, default=100)
    p.add_argument("--keep-checkpoints", action="store_true", help="keep every epoch's snapshot under --out")
    p.add_argument("--out", type=Path, default=Path("runs/time_to_quality"))
    p.add_argument("--throughput-only", action="store_true", help="only the step throughput of each variant")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="--throughput-only: write the rows here")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.variants = ["default"] + [v for v in dict.fromkeys(args.variants) if v != "default"]
    if any(not 0 < b <= 1 for b in args.budgets):
        p.error(f"--budgets are fractions of the default recipe's time in (0, 1], got {args.budgets}")
    return args


def main(argv: list[str] | None = None) -> str | list[dict]:
    args = parse(argv)
    torch.set_float32_matmul_precision("high")
    if args.throughput_only:
        rows = step_throughput(args)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2))
        return rows
    args.out.mkdir(parents=True, exist_ok=True)
    per_seed = [run_seed(args, seed) for seed in args.seeds]
    table = summarise(args, per_seed)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps({"seeds": args.seeds, "runs": per_seed}, indent=2))
    plot(args, per_seed)
    print(table)
    print(f"\nwrote {args.out}/table.md, results.json, accuracy_vs_time.png")
    return table


if __name__ == "__main__":
    main()
