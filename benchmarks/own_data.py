"""Pretrain on your own data, measured: continue from RGB MAE weights on 16-bit grayscale images,
against pretraining from scratch, with the same budget.

The "domain data" is scikit-learn's handwritten digits written as 16-bit grayscale PNG files (an
ImageFolder, 1,437 training / 360 validation images at 32x32); the "released weights" are the
default RGB digits pretraining run (``configs/pretrain/default.yaml``). On the grayscale folder:

1. ``mae stats`` gives its mean / std;
2. pretraining for ``--epochs`` epochs, from scratch and with ``model.init_from`` the RGB run
   (patch embedding adapted to 1 channel, decoder loaded, ``freeze_encoder_epochs`` of decoder
   warm-up), logging the kNN monitor (k=20, cls token) and reconstructions;
3. fine-tuning each encoder with ``configs/finetune/default.yaml``'s recipe.

Prints a markdown table and writes ``results.json``, the last reconstruction figure of each run and
the runs' folders under ``--out``.

    python benchmarks/own_data.py --out benchmarks/results/own_data_digits16   # ~7 min on 2 CPU cores
"""

import argparse
import csv
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from sklearn.datasets import load_digits
from torch.nn import functional as F

from mae.cli.main import invoke

REPO = Path(__file__).resolve().parents[1]


def write_digits16(root: Path, size: int = 32, per_class: int | None = None) -> Path:
    """The digits as 16-bit grayscale PNGs, ``root/{train,val}/<digit>/<i>.png`` (every fifth image in
    val), at most ``per_class`` images of each digit in each split when set."""
    digits = load_digits()
    images = torch.from_numpy(digits.images / 16.0).float()[:, None]
    images = F.interpolate(images, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    for i, (image, label) in enumerate(zip(images[:, 0].numpy(), digits.target, strict=True)):
        folder = root / ("val" if i % 5 == 0 else "train") / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        if per_class is not None and len(list(folder.iterdir())) >= per_class:
            continue
        Image.fromarray(np.round(image * 65535).astype(np.uint16)).save(folder / f"{i:04d}.png")
    return root


def _config(
    path: Path, name: str, base: str, model: dict, data: dict, trainer: dict, **sections
) -> list[str]:
    recipe = yaml.safe_load((REPO / base).read_text())
    for key, value in model.items():  # a group (encoder, optim) is merged, not replaced
        merged = (
            {**recipe["model"][key], **value} if isinstance(value, dict) and key in recipe["model"] else value
        )
        recipe["model"][key] = merged
    optim = recipe["model"]["optim"]
    optim["warmup_epochs"] = min(optim["warmup_epochs"], trainer["max_epochs"] / 4)
    recipe["data"] = {"class_path": "mae.data.ImageFolderDataModule", "init_args": data}
    recipe["trainer"].update(trainer)
    recipe["trainer"]["logger"]["init_args"] = {"save_dir": str(path.parent / "runs"), "name": name}
    recipe.update(sections)
    path.write_text(yaml.safe_dump(recipe))
    return ["--config", str(path)]


def _last(metrics: Path, key: str) -> float:
    with open(metrics) as f:
        return [float(r[key]) for r in csv.DictReader(f) if r.get(key)][-1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/own_data_digits16"))
    parser.add_argument("--epochs", type=int, default=10, help="pretraining epochs on the grayscale folder")
    parser.add_argument(
        "--source-epochs", type=int, default=30, help="epochs of the RGB run that is continued"
    )
    parser.add_argument("--finetune-epochs", type=int, default=20)
    parser.add_argument("--freeze-encoder-epochs", type=int, default=2)
    parser.add_argument(
        "--images-per-class", type=int, default=None, help="a smaller folder (for a quick check)"
    )
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()

    root = write_digits16(out / "digits16", per_class=args.images_per_class)
    stats = invoke("stats", [str(root), "--in-chans", "1"])
    data = {
        "root": str(root),
        "img_size": 32,
        "batch_size": 64,
        "num_workers": 0,
        "in_chans": 1,
        "mean": stats.mean,
        "std": stats.std,
        "eval_crop_ratio": 1.0,
    }

    source = invoke(
        "pretrain",
        [
            "--config",
            str(REPO / "configs/pretrain/default.yaml"),
            "--trainer.max_epochs",
            str(args.source_epochs),
            "--model.optim.warmup_epochs",
            str(min(2, args.source_epochs / 4)),
            "--trainer.logger.init_args.save_dir",
            str(out / "runs"),
            "--trainer.logger.init_args.name",
            "source_rgb",
        ],
    )
    source_ckpt = source.trainer.checkpoint_callback.last_model_path

    results = {}
    for name, extra in (
        ("scratch", {}),
        ("init_from", {"init_from": source_ckpt, "freeze_encoder_epochs": args.freeze_encoder_epochs}),
    ):
        pre = invoke(
            "pretrain",
            _config(
                out / f"pretrain_{name}.yaml",
                f"pretrain_{name}",
                "configs/pretrain/default.yaml",
                extra,
                {**data, "augmentation": "pretrain"},
                {"max_epochs": args.epochs},
                knn={"every_n_epochs": args.epochs},
                reconstruction={"every_n_epochs": args.epochs, "num_images": 8},
            ),
        )
        run = Path(pre.trainer.log_dir)
        ft = invoke(
            "finetune",
            _config(
                out / f"finetune_{name}.yaml",
                f"finetune_{name}",
                "configs/finetune/default.yaml",
                {"encoder": {"checkpoint": pre.trainer.checkpoint_callback.last_model_path}},
                {**data, "augmentation": "finetune", "re_prob": 0.0},
                {"max_epochs": args.finetune_epochs},
            ),
        )
        results[name] = {
            "pretrain_loss_first_epoch": pre.model.epoch_losses[0],
            "pretrain_loss_last_epoch": pre.model.epoch_losses[-1],
            "knn_acc1": _last(run / "metrics.csv", "val/knn_acc1"),
            "finetune_acc1": 100 * _last(Path(ft.trainer.log_dir) / "metrics.csv", "val/acc1"),
        }
        figures = sorted((run / "reconstructions").glob("*.png"))
        if figures:
            shutil.copy(figures[-1], out / f"reconstructions_{name}.png")
    results["meta"] = {
        "epochs": args.epochs,
        "source_epochs": args.source_epochs,
        "finetune_epochs": args.finetune_epochs,
        "freeze_encoder_epochs": args.freeze_encoder_epochs,
        "mean": stats.mean,
        "std": stats.std,
        "wall_seconds": round(time.time() - start),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(
        f"\n| 16-bit gray digits, {args.epochs} pretraining epochs | loss first -> last epoch | kNN top-1 | "
        f"fine-tuned top-1 ({args.finetune_epochs} epochs) |\n|---|---|---:|---:|"
    )
    for name in ("scratch", "init_from"):
        r = results[name]
        print(
            f"| {name} | {r['pretrain_loss_first_epoch']:.3f} -> {r['pretrain_loss_last_epoch']:.3f} | "
            f"{r['knn_acc1']:.1f} % | {r['finetune_acc1']:.1f} % |"
        )
    return results


if __name__ == "__main__":
    main()
