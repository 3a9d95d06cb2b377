"""Does MAE pretraining help here? Pretrain, then compare the encoder with the same architecture untrained.

For each seed: MAE pretraining for a fixed budget; then, on the pretrained encoder and on a
randomly initialised one of the same architecture, kNN (k=20) and linear-probe accuracy (the fast
probe on cached features by default, ``--probe lars`` for the paper's protocol), and
fine-tuning with 10% and with 100% of the training labels (from random init that is training from
scratch with the same budget). Prints a markdown table (mean +- std over seeds, epochs, wall time)
and writes plots: the pretraining loss, reconstructions during pretraining, and an accuracy chart.

    python benchmarks/quality.py                       # built-in digits, 3 seeds, ~19 min on 2 CPU cores
    python benchmarks/quality.py --seeds 0             # one seed, ~6.5 min
    python benchmarks/quality.py --data imagefolder --root /data/in100 --img-size 224 \\
        --model mae_vit_small_patch16
"""

import argparse
import csv
import json
import shutil
import statistics
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from mae.convert.backbone import build_vit, load_backbone
from mae.data import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from mae.eval.knn import knn_evaluate
from mae.eval.probe import ProbeSettings, evaluate
from mae.models import create_model
from mae.training.callbacks import ReconstructionCallback
from mae.training.finetune import MAEFinetuneModule
from mae.training.pretrain import MAEPretrainModule

# The default job's model (configs/pretrain/default.yaml).
SMALL_VIT = dict(
    embed_dim=128, depth=4, num_heads=4, decoder_embed_dim=96, decoder_depth=2, decoder_num_heads=4
)


FEATURE_BATCH = 256  # images per forward pass when extracting frozen features


def make_data(
    args: argparse.Namespace,
    augmentation: str,
    fraction: float = 1.0,
    seed: int = 0,
    batch_size: int | None = None,
) -> ImageDataModule:
    common = dict(
        img_size=args.img_size,
        batch_size=batch_size or args.batch_size,
        num_workers=args.workers,
        augmentation=augmentation,
        train_fraction=fraction,
        subset_seed=seed,
    )
    if augmentation == "finetune":
        common.update(auto_augment=args.auto_augment, re_prob=args.re_prob)
    if args.data == "digits":
        dm = DigitsDataModule(**common)
    elif args.data == "imagefolder":
        dm = ImageFolderDataModule(args.root, **common)
    else:
        dm = CIFARDataModule(args.root, dataset=args.data, **common)
    return dm


def trainer(out: Path, name: str, epochs: int, callbacks=(), validate_every: int = 1) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs,
        check_val_every_n_epoch=validate_every,
        accelerator="auto",
        devices=1,
        logger=CSVLogger(out, name=name, version=""),
        enable_checkpointing=name == "pretrain",
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=5,
        callbacks=list(callbacks),
        default_root_dir=out,
    )


def encoder_for(args, checkpoint: str | None) -> torch.nn.Module:
    """The pretrained encoder, or the same architecture with timm's random initialisation."""
    if checkpoint is not None:
        return load_backbone(checkpoint, args.img_size)
    with torch.device("meta"):
        config = create_model(args.model, img_size=args.img_size, **args.model_kwargs).config
    return build_vit(config, args.img_size)


def evaluate_encoder(
    args,
    out: Path,
    seed: int,
    checkpoint: str | None,
    tag: str,
    fractions: tuple[float, ...] = (0.1, 1.0),
    validate_last_only: bool = False,
) -> dict[str, float]:
    """kNN, linear probe, fine-tuning on each fraction of the labels (10% and 100%), for one encoder; the
    fine-tuning validated after every epoch, or (``validate_last_only``) after the last alone, in less
    time: the accuracy reported is the final model's either way."""
    results = {}
    source = dict(checkpoint=checkpoint, model=args.model, model_kwargs=args.model_kwargs)
    common = dict(encoder=source, img_size=args.img_size)
    # kNN on frozen features
    pl.seed_everything(seed)
    encoder = encoder_for(args, checkpoint).eval()
    dm = make_data(args, "none", batch_size=FEATURE_BATCH)
    results["kNN"] = knn_evaluate(encoder, dm)[0]  # the command's and the monitor's kNN
    if "fast" in args.probe:  # many linear heads on cached cls features, chosen on held-out training images
        settings = ProbeSettings(seed=seed, max_epochs=args.probe_max_epochs)
        results["linear probe (fast)"] = evaluate(encoder, dm, settings)[0].val_acc1
    if "lars" in args.probe:  # the paper's protocol: frozen encoder, BatchNorm + linear head, LARS
        pl.seed_everything(seed)
        dm = make_data(args, args.probe_augmentation)
        probe = MAEFinetuneModule(
            **common,
            num_classes=dm.num_labels,
            mode="linprobe",
            global_pool="token",
            mixup=0,
            cutmix=0,
            drop_path_rate=0,
            label_smoothing=0,
            head_init_std=0.01,
            optim=dict(weight_decay=0, lr=args.probe_lr, min_lr=0, warmup_epochs=0.1 * args.probe_epochs),
        )
        t = trainer(out, f"{tag}_linprobe", args.probe_epochs)
        t.fit(probe, datamodule=dm)
        results["linear probe (LARS)"] = 100 * float(t.callback_metrics["val/acc1"])
    # fine-tuning on a fraction of the labels (random init: training from scratch), with the same
    # number of optimizer steps for every fraction: a tenth of the images gets ten times the epochs
    for fraction in fractions:
        epochs = round(args.finetune_epochs / fraction)
        validate_every = epochs if validate_last_only else 1
        pl.seed_everything(seed)
        dm = make_data(args, "finetune", fraction, seed)
        model = MAEFinetuneModule(
            **common,
            num_classes=dm.num_labels,
            layer_decay=args.layer_decay,
            mixup=args.mixup,
            cutmix=args.cutmix,
            optim=dict(base_lr=args.finetune_blr, warmup_epochs=0.1 * epochs),
        )
        t = trainer(out, f"{tag}_finetune_{int(fraction * 100)}", epochs, validate_every=validate_every)
        t.fit(model, datamodule=dm)
        results[f"fine-tune {int(fraction * 100)}% labels"] = 100 * float(t.callback_metrics["val/acc1"])
    return results


def run_seed(args, seed: int) -> dict[str, dict[str, float]]:
    out = args.out / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    pl.seed_everything(seed)
    start = time.perf_counter()
    pretrain = MAEPretrainModule(
        model=args.model,
        img_size=args.img_size,
        model_kwargs=args.model_kwargs,
        optim=dict(base_lr=args.pretrain_blr, warmup_epochs=args.pretrain_warmup),
    )
    figures = ReconstructionCallback(every_n_epochs=max(1, args.pretrain_epochs // 3), num_images=6)
    t = trainer(out, "pretrain", args.pretrain_epochs, [figures])
    t.fit(pretrain, datamodule=make_data(args, "pretrain"))
    ckpt = t.checkpoint_callback.last_model_path or t.checkpoint_callback.best_model_path
    wall = {"pretrain": time.perf_counter() - start}
    results = {}
    for tag, checkpoint in (("mae", ckpt), ("random", None)):
        start = time.perf_counter()
        results[tag] = evaluate_encoder(args, out, seed, checkpoint, tag)
        wall[tag] = time.perf_counter() - start
    load_backbone(ckpt)  # the pretrained encoder is reusable as a timm backbone
    results["wall_s"] = wall
    return results


def summarise(args, per_seed: list[dict]) -> str:
    metrics = list(per_seed[0]["mae"])
    fmt = lambda xs: (  # noqa: E731
        f"{statistics.mean(xs):.1f}" + (f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else "")
    )
    lines = ["| encoder | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    names = {"mae": f"MAE-pretrained ({args.pretrain_epochs} epochs)", "random": "random init (from scratch)"}
    for tag in ("mae", "random"):
        lines.append(
            f"| {names[tag]} | " + " | ".join(fmt([r[tag][m] for r in per_seed]) for m in metrics) + " |"
        )
    wall = {k: statistics.mean(r["wall_s"][k] for r in per_seed) / 60 for k in per_seed[0]["wall_s"]}
    lines.append("")
    lines.append(
        f"Top-1 % on the validation split, mean ± std over seeds {args.seeds}; kNN k=20; fast linear probe: "
        f"cls features, lr x weight-decay grid chosen on held-out training images; LARS probe "
        f"{args.probe_epochs} epochs ({args.probe_augmentation} augmentation); fine-tuning "
        f"{args.finetune_epochs} epochs on 100% of the labels and the same number of steps on 10%. "
        f"Wall time per seed: pretraining "
        f"{wall['pretrain']:.1f} min, evaluations {wall['mae']:.1f} min (pretrained) + "
        f"{wall['random']:.1f} min (random)."
    )
    return "\n".join(lines)


def plots(args, per_seed: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed_dir = args.out / f"seed{args.seeds[0]}"
    with open(seed_dir / "pretrain" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss_epoch")]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([int(r["epoch"]) + 1 for r in rows], [float(r["train/loss_epoch"]) for r in rows])
    ax.set(xlabel="epoch", ylabel="training loss (norm-pix MSE, masked patches)", title="MAE pretraining")
    fig.tight_layout()
    fig.savefig(args.out / "pretrain_loss.png", dpi=120)

    metrics = list(per_seed[0]["mae"])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.38
    for i, (tag, label) in enumerate((("mae", "MAE-pretrained"), ("random", "random init / scratch"))):
        means = [statistics.mean(r[tag][m] for r in per_seed) for m in metrics]
        errs = [statistics.stdev(r[tag][m] for r in per_seed) if len(per_seed) > 1 else 0 for m in metrics]
        ax.bar([x + (i - 0.5) * width for x in range(len(metrics))], means, width, yerr=errs, label=label)
    ax.set_xticks(range(len(metrics)), metrics, fontsize=8)
    ax.set(ylabel="top-1 %", ylim=(0, 100))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "accuracy.png", dpi=120)
    for png in sorted((seed_dir / "pretrain" / "reconstructions").glob("*.png")):
        shutil.copy(png, args.out / f"reconstructions_{png.name}")


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="digits", choices=["digits", "imagefolder", "cifar10", "cifar100"])
    p.add_argument("--root", default="data")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--model", default="mae_vit_tiny_patch4")
    p.add_argument("--model-kwargs", type=json.loads, default=SMALL_VIT)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--pretrain-epochs", type=int, default=30)
    p.add_argument("--pretrain-warmup", type=float, default=2)
    p.add_argument("--pretrain-blr", type=float, default=1e-3)
    p.add_argument(
        "--probe",
        nargs="+",
        choices=["fast", "lars"],
        default=["fast"],
        help="fast (converged, on cached features; default) and/or lars (the paper protocol)",
    )
    p.add_argument("--probe-epochs", type=int, default=10, help="epochs of the LARS probe")
    p.add_argument(
        "--probe-max-epochs", type=int, default=100, help="epochs of the fast probe's heads, at most"
    )
    # LARS's trust ratio fixes each step's relative size at lr x 0.001, so a small batch needs the
    # paper's absolute lr (0.1 x 16384 / 256 = 6.4), not the linearly scaled one, to learn at all.
    p.add_argument("--probe-lr", type=float, default=6.4)
    # The paper probes with random crops down to 8% of the image plus flips; on 8x8 digit scans that
    # destroys the digit (and flips change it), so the built-in data probes on the plain images.
    p.add_argument(
        "--probe-augmentation",
        choices=["linprobe", "none"],
        default=None,
        help="training augmentation of the linear probe (default: none for digits, else linprobe)",
    )
    p.add_argument("--finetune-epochs", type=int, default=20)
    p.add_argument("--finetune-blr", type=float, default=1e-2)
    p.add_argument("--layer-decay", type=float, default=0.75)
    p.add_argument("--mixup", type=float, default=0.0)
    p.add_argument("--cutmix", type=float, default=0.0)
    p.add_argument("--auto-augment", default=None)
    p.add_argument("--re-prob", type=float, default=0.0)
    p.add_argument("--out", type=Path, default=Path("runs/quality"))
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.probe_augmentation is None:
        args.probe_augmentation = "none" if args.data == "digits" else "linprobe"
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    torch.set_float32_matmul_precision("high")
    per_seed = [run_seed(args, seed) for seed in args.seeds]
    table = summarise(args, per_seed)
    (args.out / "results.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps(per_seed, indent=2))
    plots(args, per_seed)
    print(table)
    print(
        f"\nwrote {args.out}/results.md, results.json, pretrain_loss.png, accuracy.png, reconstructions_*.png"
    )
    return table


if __name__ == "__main__":
    main()
