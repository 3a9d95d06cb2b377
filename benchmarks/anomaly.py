"""Does an MAE's reconstruction error find defects? The default pretraining run's MAE vs a pixel kNN
baseline on the built-in digit anomaly task (``mae.apps.anomaly.digits``), over several seeds.

For each seed: the task is written with that seed (which validation digits get which defect, and where),
``mae anomaly`` scores it with masks of that seed (standardised by the training digits' errors,
and again with ``--raw-errors``), and its ``--method pixel-knn`` (the baseline, ``mae.apps.anomaly.baseline``)
scores the same images at the MAE's size, patch size and normalisation through the same scoring and
metrics. Prints a markdown table (mean +- std over seeds) and writes it, the per-seed metrics, a bar chart
and the heat maps of the first seed.

    mae pretrain --config configs/pretrain/default.yaml   # the MAE, once (~2-4 min)
    python benchmarks/anomaly.py                             # 3 seeds, ~1.5 min each on 2 CPU cores
"""

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch

from mae.apps.anomaly.digits import write_digit_anomalies
from mae.cli.main import invoke
from mae.inference.reconstruction import load_reconstructor

REPO = Path(__file__).resolve().parents[1]
MAE = "MAE reconstruction error, standardised"
MAE_RAW = "MAE reconstruction error, raw"
KNN = "pixel kNN (baseline)"
METRICS = {"image_auroc": "image AUROC", "pixel_auroc": "pixel AUROC", "aupro": "AUPRO (FPR <= 0.3)"}


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, dict]:
    """The three methods' metrics on the task of ``seed``."""
    root = write_digit_anomalies(
        args.tasks / f"seed{seed}",
        seed=seed,
        img_size=args.img_size,
        num_normal=args.num_normal,
        num_test=args.num_test,
    )
    out = args.out / f"seed{seed}"
    data = [
        "--normal",
        str(root / "train" / "good"),
        "--test",
        str(root / "test"),
        "--top-k",
        str(args.top_k),
        "--batch-size",
        "128",
    ]
    common = ["--checkpoint", str(args.checkpoint), "--seed", str(seed), *data]
    figures = "overview" if seed == args.seeds[0] else "none"
    results = {}
    start = time.perf_counter()
    results[MAE] = invoke("anomaly", [*common, "--out", str(out / "mae"), "--figures", figures]).metrics
    results[MAE]["seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    results[MAE_RAW] = invoke(
        "anomaly", [*common, "--out", str(out / "mae_raw"), "--raw-errors", "--figures", "none"]
    ).metrics
    results[MAE_RAW]["seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    results[KNN] = invoke(
        "anomaly", [*pixel_knn_flags(args.checkpoint), *data, "--out", str(out / "knn"), "--figures", figures]
    ).metrics
    results[KNN]["seconds"] = time.perf_counter() - start
    if seed == args.seeds[0]:
        shutil.copy(out / "mae" / "overview.png", args.out / f"heatmaps_seed{seed}.png")
        shutil.copy(out / "knn" / "overview.png", args.out / f"knn_heatmaps_seed{seed}.png")
    return results


def pixel_knn_flags(checkpoint: Path) -> list[str]:
    """``--method pixel-knn`` at the MAE's input size, patch size and normalisation: the same images, the
    same patches."""
    model, norm = load_reconstructor(checkpoint)
    return [
        "--method",
        "pixel-knn",
        "--img-size",
        str(model.config["img_size"][0]),
        "--patch-size",
        str(model.patch_size),
        "--mean",
        *map(str, norm.mean),
        "--std",
        *map(str, norm.std),
    ]


def summarise(results: dict[str, list[dict]]) -> str:
    """Markdown table: one row per method, mean +- std over seeds (and each seed's value) per metric."""
    lines = [
        "| method | " + " | ".join(METRICS.values()) + " | seconds per seed |",
        "|---|" + "---:|" * (len(METRICS) + 1),
    ]
    for method, runs in results.items():
        cells = []
        for key in METRICS:
            values = [100 * r[key] for r in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(
                f"{statistics.mean(values):.1f} ± {spread:.1f} ({', '.join(f'{v:.1f}' for v in values)})"
            )
        lines.append(
            f"| {method} | " + " | ".join(cells) + f" | {statistics.mean(r['seconds'] for r in runs):.0f} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(results)
    for i, (method, runs) in enumerate(results.items()):
        means = [statistics.mean(100 * r[k] for r in runs) for k in METRICS]
        errs = [statistics.stdev(100 * r[k] for r in runs) if len(runs) > 1 else 0 for k in METRICS]
        offsets = [x + (i - (len(results) - 1) / 2) * width for x in range(len(METRICS))]
        ax.bar(offsets, means, width, yerr=errs, label=method)
    ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")  # chance for the AUROCs
    ax.set_xticks(range(len(METRICS)), list(METRICS.values()), fontsize=8)
    ax.set(ylabel="%", ylim=(0, 100), title="digit anomalies: mean ± std over seeds")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=REPO / "runs/pretrain_default/version_0/checkpoints/last.ckpt",
        help="the MAE (default: the default pretraining run's last checkpoint)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--img-size", type=int, default=32, help="the task's image size (the MAE's input size)")
    p.add_argument("--num-normal", type=int, default=None, help="training digits (default: all 1,437)")
    p.add_argument("--num-test", type=int, default=None, help="validation digits (default: all 360)")
    p.add_argument("--top-k", type=int, default=4, help="image score: mean of the k highest patch scores")
    p.add_argument(
        "--tasks", type=Path, default=REPO / "data" / "digit_anomalies", help="where the tasks are written"
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "anomaly_digits")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.checkpoint.exists():
        p.error(
            f"--checkpoint {args.checkpoint} does not exist: run "
            f"`mae pretrain --config default` first, or point it at another one"
        )
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    results: dict[str, list[dict]] = {MAE: [], MAE_RAW: [], KNN: []}
    for seed in args.seeds:
        for method, metrics in run_seed(args, seed).items():
            results[method].append(metrics)
            print(f"seed {seed} {method}: " + ", ".join(f"{k} {metrics[k]:.4f}" for k in METRICS), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = summarise(results)
    (args.out / "table.md").write_text(table + "\n")
    plot(results, args.out / "auroc.png")
    print(table)
    return table


if __name__ == "__main__":
    main()
