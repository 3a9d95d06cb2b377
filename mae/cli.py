"""Every command-line entry point: ``train.py`` and ``finetune.py`` (LightningCLI: every model, data and
trainer key from YAML or flags), ``python -m mae.export``, ``python -m mae.knn`` and
``python -m mae.data.stats``, ``python -m mae.reconstruct``, ``python -m mae.demo`` and
``python -m mae.probe``."""

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image

from mae.convert.backbone import load_backbone, load_mae
from mae.convert.export import export_encoder
from mae.convert.sources import FORMATS, read_checkpoint
from mae.data import DEFAULT_MAX_PIXELS, ImageDataModule
from mae.data.tools.stats import ChannelStats, channel_stats
from mae.eval.knn import knn_evaluate
from mae.eval.own_images import Figure, Normalization, display_range, image_paths, load_image, reconstruction_figure
from mae.eval.probe import (
    DEFAULT_LRS,
    DEFAULT_WEIGHT_DECAYS,
    FeatureStore,
    Pool,
    ProbeResult,
    check_grid,
    check_training,
    pooled,
    train_probe,
)
from mae.io.atomic import atomic_write
from mae.training.callbacks import (
    PREEMPTED_EXIT_CODE,
    ImageThroughputMonitor,
    KNNCallback,
    PreemptionSignals,
    ProbeCallback,
    ReconstructionCallback,
    RemoveOrphanTemporaries,
    SigtermCheckpoint,
)
from mae.training.checkpointing import AtomicCheckpointIO, check_resume_checkpoint
from mae.training.finetune import MAEFinetuneModule
from mae.training.pretrain import MAEPretrainModule
from mae.training.resume import continue_in_run_folder, resolve_ckpt_path
from mae.training.runtime import keep_freed_memory, native_bf16


def default_precision() -> str:
    """bf16 autocast where the device that trains computes bf16 natively (a GPU from Ampere on, a CPU
    with AVX-512 BF16 / AMX; fp16 MAE runs are known to hit NaNs), else fp32."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return "bf16-mixed" if native_bf16(device) else "32-true"


def trainer_defaults(run_name: str) -> dict[str, Any]:
    """Trainer settings when a config gives none: CSV metrics under ``runs/<run_name>``."""
    return {
        "precision": default_precision(),
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                   "init_args": {"save_dir": "runs", "name": run_name}},
        "log_every_n_steps": 10,
    }  # fmt: skip


class _MAECLI(LightningCLI):
    """Shared by the entry points: one input size (``data.img_size``) feeds the model; checkpoints
    and throughput logging are always on and configured under their own keys."""

    linked = {"img_size": "data.img_size", "in_chans": "data.in_chans"}  # model keys that come from the data module

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if isinstance(args, dict):
            super().parse_arguments(parser, args)
            return
        argv = expand_stacked_configs([str(a) for a in (args if args is not None else sys.argv[1:])])
        for key, source in self.linked.items():
            on_command_line = any(a == f"--model.{key}" or a.startswith(f"--model.{key}=") for a in argv)
            # jsonargparse drops a linked key set in a YAML file without a word: refuse it here.
            if on_command_line or key in _model_section_keys(argv):
                parser.error(f"model.{key} is taken from {source} so data and model agree: set {source} instead")
        self.config = parser.parse_args(argv)  # as LightningCLI does, with the stacked configs' bases added

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.img_size", "model.img_size", apply_on="instantiate")
        parser.link_arguments("data.in_chans", "model.in_chans", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.filename": "epoch_{epoch:04d}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": -1,
                "checkpoint.every_n_epochs": 10,
            }
        )
        parser.add_lightning_class_args(ImageThroughputMonitor, "throughput")
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Resume from this checkpoint, e.g. <run>/checkpoints/last.ckpt, continuing in its run folder; "
            "'last': the newest last.ckpt of the configured run, or a fresh start when there is none (requeue-safe)",
        )


class PretrainCLI(_MAECLI):
    """``train.py``: adds reconstruction figures and the kNN monitor."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_lightning_class_args(ReconstructionCallback, "reconstruction")
        parser.add_lightning_class_args(KNNCallback, "knn")
        parser.set_defaults({"knn.every_n_epochs": 0})
        parser.add_lightning_class_args(ProbeCallback, "probe")


class FinetuneCLI(_MAECLI):
    """``finetune.py``: the class count comes from the data too; the best checkpoint by ``val/acc1``."""

    linked = {"img_size": "data.img_size", "in_chans": "data.in_chans", "num_classes": "data (its number of classes)"}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.num_labels", "model.num_classes", apply_on="instantiate")
        parser.set_defaults(
            {"checkpoint.monitor": "val/acc1", "checkpoint.mode": "max", "checkpoint.save_top_k": 1,
             "checkpoint.every_n_epochs": 1}
        )  # fmt: skip
        parser.add_argument(
            "--validate_only", type=bool, default=False,
            help="Only evaluate (top-1/top-5 on the validation split), e.g. a fine-tuned --ckpt_path",
        )  # fmt: skip


# First line of a config that only changes another one (``configs/pretrain/imagenet_vit_base_1gpu.yaml``).
_STACKS_ON = re.compile(r"^# stacks on: (\S+\.yaml)")


def _config_files(argv: list[str]) -> list[tuple[int, str]]:
    """(position, path) of every ``--config PATH`` / ``--config=PATH`` (or ``-c``) in ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            found.append((i + 1, argv[i + 1]))
        elif arg.startswith(("--config=", "-c=")):
            found.append((i, arg.split("=", 1)[1]))
    return found


def expand_stacked_configs(argv: list[str]) -> list[str]:
    """Put the base config before every stacked config given without it.

    A stacked config names its base on its first line (``# stacks on: base.yaml``, relative to the
    file); ``--config base.yaml --config stacked.yaml`` is the documented form, and a stacked
    config given alone gets its base inserted before it, so it still runs the whole recipe.
    """
    out = list(argv)
    for position, path in reversed(_config_files(argv)):
        file = Path(path)
        first_line = file.read_text().split("\n", 1)[0] if file.is_file() else ""
        match = _STACKS_ON.match(first_line)
        if match is None:
            continue
        base = file.parent / match.group(1)
        given = [Path(p).resolve() for _, p in _config_files(argv) if Path(p).is_file()]
        if base.resolve() not in given:
            start = position if out[position].startswith(("--config=", "-c=")) else position - 1
            out[start:start] = ["--config", str(base)]
    return out


def _model_section_keys(argv: list[str]) -> set[str]:
    """Keys under ``model:`` in the YAML files given with ``--config``."""
    keys: set[str] = set()
    for _, path in _config_files(argv):
        if Path(path).is_file():
            config = yaml.safe_load(Path(path).read_text()) or {}
            if isinstance(config.get("model"), dict):
                keys |= set(config["model"])
    return keys


def harden_trainer(trainer: pl.Trainer) -> None:
    """Atomic checkpoint writes (temporary file, then rename), a checkpoint on SIGTERM (sent to one
    process or to the whole job), and no temporary files left over from a kill during an earlier save."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()
    trainer._signal_connector = PreemptionSignals(trainer)
    trainer.callbacks += [SigtermCheckpoint(), RemoveOrphanTemporaries()]


def _resume(cli: LightningCLI, fitting: bool) -> str | None:
    """``--ckpt_path`` resolved (``last``) and validated against the model; when ``fitting``, the
    checkpoint's run folder is continued (an evaluation logs into a folder of its own)."""
    ckpt_path = resolve_ckpt_path(cli.trainer, cli.config.ckpt_path)
    if ckpt_path is not None:
        step = check_resume_checkpoint(ckpt_path, cli.model)
        keep_metrics = continue_in_run_folder(cli.trainer, ckpt_path, step) if fitting else None
        if keep_metrics is not None:
            cli.trainer.callbacks.append(keep_metrics)
    return ckpt_path


def _build(cli_class: type[_MAECLI], module: type, trainer_defaults: dict, args: list[str] | None) -> Any:
    """Parse and instantiate; then check ``--ckpt_path`` and harden the trainer, all before any work."""
    keep_freed_memory()  # no page faults re-mapping activations every step (mae.training.runtime)
    cli = cli_class(
        module,
        ImageDataModule,
        subclass_mode_data=True,
        run=False,
        args=args,
        seed_everything_default=0,
        trainer_defaults=trainer_defaults,
        save_config_kwargs={"overwrite": True},
    )
    harden_trainer(cli.trainer)
    return cli, _resume(cli, fitting=not cli.config.get("validate_only", False))


def _run(cli: LightningCLI, stage: str, ckpt_path: str | None) -> Any:
    """``trainer.fit`` or ``trainer.validate``; after a SIGTERM (and, when fitting, its checkpoint),
    exit with ``PREEMPTED_EXIT_CODE``, not 0."""
    try:
        return getattr(cli.trainer, stage)(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        sys.exit(PREEMPTED_EXIT_CODE)


def pretrain_main(args: list[str] | None = None) -> PretrainCLI:
    """Parse the config, build model/data/trainer, train, and print where the outputs are."""
    cli, ckpt_path = _build(PretrainCLI, MAEPretrainModule, trainer_defaults("pretrain"), args)
    _run(cli, "fit", ckpt_path)
    print_run_summary(cli.trainer, Path(cli.trainer.log_dir or cli.trainer.default_root_dir))
    return cli


def finetune_main(args: list[str] | None = None) -> FinetuneCLI:
    """Fine-tune / linear-probe (or only evaluate), then print top-1 / top-5 and where the outputs are."""
    cli, ckpt_path = _build(FinetuneCLI, MAEFinetuneModule, trainer_defaults("finetune"), args)
    if cli.config.validate_only:
        results = _run(cli, "validate", ckpt_path)
        print_accuracy(results[0] if results else {})
        return cli
    _run(cli, "fit", ckpt_path)
    print_run_summary(cli.trainer, Path(cli.trainer.log_dir or cli.trainer.default_root_dir))
    print_accuracy({k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/acc")})
    return cli


@rank_zero_only
def print_accuracy(metrics: dict[str, float]) -> None:
    if "val/acc1" in metrics:
        print(f"validation top-1 {metrics['val/acc1'] * 100:.2f}%, top-5 {metrics['val/acc5'] * 100:.2f}%", flush=True)


@rank_zero_only
def print_run_summary(trainer: pl.Trainer, log_dir: Path) -> None:
    """Tell the user where the run's outputs are and how the loss went (``log_dir``: found on every
    process beforehand, since finding it is a collective)."""
    lines = [f"Run folder: {log_dir}"]
    for name, path in (("config", log_dir / "config.yaml"), ("metrics", log_dir / "metrics.csv")):
        if path.exists():
            lines.append(f"  {name + ':':<18}{path}")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.last_model_path:
        lines.append(f"  {'last checkpoint:':<18}{checkpoint.last_model_path}")
    if checkpoint is not None and checkpoint.best_model_path and checkpoint.monitor:
        lines.append(f"  {'best checkpoint:':<18}{checkpoint.best_model_path} ({checkpoint.monitor})")
    figures = [cb.last_path for cb in trainer.callbacks if isinstance(cb, ReconstructionCallback) and cb.last_path]
    if figures:
        lines.append(f"  {'reconstructions:':<18}{figures[0]}")
    losses = getattr(trainer.lightning_module, "epoch_losses", [])
    if losses:
        shown = " -> ".join(f"{v:.4f}" for v in losses)
        lines.append(f"  train loss per epoch: {shown}")
    print("\n".join(lines), flush=True)


def export_main(argv: list[str] | None = None) -> None:
    """``python -m mae.export CHECKPOINT OUT.safetensors``: the encoder as a plain timm ViT + its arguments."""
    parser = argparse.ArgumentParser(
        description="Export a pretrained encoder as a plain timm ViT (safetensors + a JSON of its timm arguments).",
        prog="python -m mae.export",
    )
    parser.add_argument(
        "checkpoint", help="our .ckpt, an official MAE .pth, a timm state dict or a Hugging Face folder"
    )
    parser.add_argument("out", help="output .safetensors path (a .json with the timm arguments is written beside it)")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="source format (default: detect)")
    parser.add_argument("--num_heads", type=int, default=None, help="attention heads, for files that do not say")
    args = parser.parse_args(argv)
    weights, sidecar = export_encoder(args.checkpoint, args.out, args.format, args.num_heads)
    for note in read_checkpoint(args.checkpoint, args.format).notes:
        print(f"note: {note}")
    meta = json.loads(sidecar.read_text())
    print(f"wrote {weights} and {sidecar}")
    print(
        f'load with timm alone: timm.create_model("{meta["architecture"]}", pretrained=True, '
        f'pretrained_cfg_overlay=dict(file="{weights}"), **json.load(open("{sidecar}"))["model_args"])'
    )


def knn_command(
    checkpoint: Path,
    data: ImageDataModule,
    k: int = 20,
    temperature: float = 0.07,
    checkpoint_format: str = "auto",
    device: str = "cpu",
) -> tuple[float, float]:
    """kNN accuracy of a pretrained encoder: ``python -m mae.knn --checkpoint CKPT --data.class_path ...``.

    Args:
        checkpoint: any source ``mae.load_backbone`` reads.
        data: a data module (e.g. ``mae.data.DigitsDataModule``); its train split is the memory bank.
        k: neighbours.
        temperature: vote temperature.
        checkpoint_format: "auto" or a format name.
        device: where to run the encoder.
    """
    backbone = load_backbone(checkpoint, img_size=data.img_size, format=checkpoint_format, in_chans=data.in_chans)
    backbone = backbone.to(device).eval()
    acc1, acc5, queries = knn_evaluate(backbone, data, k, temperature, device)
    print(f"kNN (k={k}, T={temperature}) on {queries} validation images: top-1 {acc1:.2f}%, top-5 {acc5:.2f}%")
    return acc1, acc5


def knn_main(argv: list[str] | None = None) -> tuple[float, float]:
    from jsonargparse import CLI

    return CLI(knn_command, as_positional=False, args=argv)


def stats_main(argv: list[str] | None = None) -> ChannelStats:
    """``python -m mae.data.stats ROOT``: per-channel mean and std to paste into a config."""
    parser = argparse.ArgumentParser(
        description="Per-channel mean and std of an image folder (ROOT/train if it exists), printed as the "
        "data.mean / data.std lines of a config.",
        prog="python -m mae.data.stats",
    )
    parser.add_argument("root", help="dataset folder (ImageFolder layout) or any folder of images")
    parser.add_argument("--in-chans", type=int, default=None, help="channels (default: the first image's)")
    parser.add_argument("--max-images", type=int, default=None, help="use this many images, spread evenly")
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help="larger images are skipped as decompression bombs (default: PIL's limit)")  # fmt: skip
    args = parser.parse_args(argv)
    stats = channel_stats(args.root, args.in_chans, args.max_images, max_pixels=args.max_image_pixels)
    for line in stats.skipped[:10]:
        print(f"skipped {line}", file=sys.stderr)
    print(f"# {stats.images:,} images, {stats.pixels:,} pixels per channel")
    print(stats.yaml(), end="")
    return stats


def reconstruct_main(argv: list[str] | None = None) -> Figure:
    """``python -m mae.reconstruct --checkpoint CKPT IMAGE_OR_FOLDER...``: a reconstruction figure of your images."""
    parser = argparse.ArgumentParser(
        prog="python -m mae.reconstruct",
        description="Mask your own images, reconstruct them with a pretrained MAE, and draw one row per image: "
        "original | masked | reconstruction | reconstruction with the visible patches pasted back.",
    )
    parser.add_argument(
        "images", nargs="+", help="image files or folders (any format and channel count the data path reads)"
    )
    parser.add_argument(
        "--checkpoint", required=True, help="a checkpoint with a decoder: ours, official full, Hugging Face"
    )
    parser.add_argument("--format", default="auto", choices=FORMATS, help="checkpoint format (default: detect)")
    parser.add_argument("--mask-ratio", type=float, default=0.75)
    parser.add_argument("--mask-strategy", choices=("random", "block", "grid"), default=None,
                        help="default: the checkpoint's (random for other files)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the masks")
    parser.add_argument("--same-mask", action="store_true", help="one mask for every image")
    parser.add_argument("--unnormalize", choices=("patch", "none"), default="patch",
                        help="norm_pix_loss models: draw masked patches with the true patches' statistics (patch, "
                        "leaks them) or the raw normalised prediction (none)")  # fmt: skip
    parser.add_argument("--img-size", type=int, default=None, help="input size (default: the checkpoint's)")
    parser.add_argument("--mean", type=float, nargs="+", default=None, help="per-channel mean (default: recorded)")
    parser.add_argument("--std", type=float, nargs="+", default=None, help="per-channel std (default: recorded)")
    parser.add_argument("--bands", type=int, nargs=3, default=None, help="channels drawn as RGB (multi-band data)")
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help="larger images are refused as decompression bombs (default: PIL's limit)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("reconstruction.png"), help="the figure (PNG)")
    args = parser.parse_args(argv)
    if not 0 < args.mask_ratio < 1:  # NaN fails this too
        parser.error(
            f"--mask-ratio must be in (0, 1), the fraction of patches hidden; got {args.mask_ratio}"
            + (" (0 hides nothing: there is nothing to reconstruct)" if args.mask_ratio == 0 else "")
        )
    if args.img_size is not None and args.img_size < 1:
        parser.error(f"--img-size must be a positive number of pixels, got {args.img_size}")

    ckpt = read_checkpoint(args.checkpoint, args.format)
    model, _ = load_mae(ckpt, **({"img_size": args.img_size} if args.img_size else {}))
    in_chans = model.config["in_chans"]
    if (args.mean is None) != (args.std is None):
        parser.error("give --mean and --std together")
    norm = Normalization(in_chans, tuple(args.mean), tuple(args.std)) if args.mean else Normalization.of(
        ckpt.data, in_chans, args.checkpoint
    )  # fmt: skip
    if len(norm.mean) != in_chans or len(norm.std) != in_chans:
        parser.error(f"--mean and --std need {in_chans} values, one per channel of the model")
    images, names = [], []
    for path in image_paths(args.images):
        try:
            images.append(load_image(path, tuple(model.config["img_size"]), norm, args.max_image_pixels))
            names.append(str(path))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            print(f"skipped {path}: {err}", file=sys.stderr)
    if not images:
        raise SystemExit(f"no readable image among {args.images}")
    figure = reconstruction_figure(
        model, torch.stack(images), names, norm, args.mask_ratio, args.seed, args.same_mask, args.unnormalize,
        args.bands, strategy=args.mask_strategy, value_range=display_range(names),
    )  # fmt: skip
    atomic_write(args.out, lambda tmp: figure.image.save(tmp, format="PNG"))
    for name, loss in zip(names, figure.losses, strict=True):
        print(f"{name}: masked-patch loss {loss:.4f}")
    print(f"note: {figure.caption}")
    print(f"wrote {args.out}")
    return figure


def demo_main(argv: list[str] | None = None) -> None:
    """``python -m mae.demo --checkpoint CKPT``: the local reconstruction page (needs the demo extra)."""
    parser = argparse.ArgumentParser(prog="python -m mae.demo", description="A local page that reconstructs your "
                                     "images with a pretrained MAE (Gradio).")  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="with a decoder: ours, official full, Hugging Face")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="checkpoint format (default: detect)")
    parser.add_argument("--examples", default=None, help="a folder of images to pick from (default: a few digits)")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default: this machine only)")
    parser.add_argument("--port", type=int, default=None, help="port to serve on (default: the first free one "
                        "from 7860)")  # fmt: skip
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help="larger images are refused as decompression bombs (default: PIL's limit)")  # fmt: skip
    parser.add_argument("--max-upload-mb", type=float, default=100, help="larger uploads are refused (default: 100)")
    args = parser.parse_args(argv)
    from mae.eval.demo_page import ReconstructionSession, build_page, choose_port, example_images, serve

    try:
        port = choose_port(args.host, args.port)
    except OSError as err:
        raise SystemExit(f"python -m mae.demo: {err}") from None
    try:
        import gradio  # noqa: F401
    except ImportError as err:
        raise SystemExit(f'the demo page needs Gradio: pip install -e ".[demo]" ({err})') from None
    if args.port is None:
        print(f"serving on port {port} (choose another with --port N)")
    session = ReconstructionSession(args.checkpoint, args.format, args.max_image_pixels)
    with example_images(args.examples) as examples:  # built-in examples are removed when the page stops
        page = build_page(session, examples)
        try:
            serve(page, args.host, port, args.max_upload_mb)
        except OSError:  # Gradio's own port check: the port was taken after ours
            raise SystemExit(f"python -m mae.demo: port {port} on {args.host} was taken as the page started: "
                             "start it again, or choose another with --port N") from None  # fmt: skip


def probe_command(
    checkpoint: Path,
    data: ImageDataModule,
    pool: Pool = "cls",
    views: int = 1,
    lrs: list[float] | None = None,
    weight_decays: list[float] | None = None,
    max_epochs: int = 100,
    patience: int = 10,
    holdout: float = 0.1,
    cache: Path | None = None,
    checkpoint_format: str = "auto",
    device: str = "cpu",
    seed: int = 0,
) -> ProbeResult:
    """A converged linear probe of a pretrained encoder on cached features:
    ``python -m mae.probe --checkpoint CKPT --data.class_path ...``.

    Args:
        checkpoint: any source ``mae.load_backbone`` reads.
        data: a labelled data module (e.g. ``mae.data.DigitsDataModule``); its training split trains
            the heads (a held-out part of it chooses them), its validation split is scored.
        pool: features: "cls" token, "avg" of the patch tokens, or "both".
        views: views of each training image: 1 = the evaluation view; more = that many views with
            the data module's training augmentation.
        lrs: the learning-rate grid (default ``mae.eval.probe.DEFAULT_LRS``, 1e-3 ... 3e-1).
        weight_decays: the weight-decay grid (default 0, 1e-4, 1e-3).
        max_epochs: cap on the heads' training.
        patience: stop after this many epochs in which no head's held-out loss improved.
        holdout: fraction of the training split held out to choose the head.
        cache: a file prefix to keep the features on disk (memory-mapped) instead of in memory.
        checkpoint_format: "auto" or a format name.
        device: where to run the encoder.
        seed: seed of the held-out split and of the heads' training.
    """
    lrs = list(lrs or DEFAULT_LRS)
    weight_decays = list(DEFAULT_WEIGHT_DECAYS if weight_decays is None else weight_decays)
    check_grid(lrs, weight_decays)
    check_training(max_epochs, patience, holdout)
    if data.num_labels < 2:
        raise ValueError(f"a linear probe needs labelled data with 2 or more classes; {type(data).__name__} has "
                         f"{data.num_labels}")  # fmt: skip
    if views < 1:
        raise ValueError(f"probe views must be >= 1, got {views}")
    backbone = load_backbone(checkpoint, img_size=data.img_size, format=checkpoint_format, in_chans=data.in_chans)
    encoder = pooled(backbone.to(device).eval(), pool)
    encode = lambda imgs: encoder(data.normalize(imgs))  # noqa: E731  (augmented views may be uint8)
    feature_train, val_set = data.feature_datasets()
    if val_set is None:
        raise ValueError(f"a linear probe is scored on a validation split; {type(data).__name__} has none")
    train_set = data.build_datasets(data.train_transform(), data.eval_transform())[0] if views > 1 else feature_train
    torch.manual_seed(seed)
    prefix = lambda split: None if cache is None else f"{cache}.{split}"  # noqa: E731
    train = FeatureStore.extract(encode, train_set, data.batch_size, data.num_workers, device, views, prefix("train"))
    val = FeatureStore.extract(encode, val_set, data.batch_size, data.num_workers, device, 1, prefix("val"))
    result = train_probe(train, val, data.num_labels, tuple(lrs), tuple(weight_decays), holdout, max_epochs,
                         patience, seed=seed)  # fmt: skip
    print(f"{result} on {len(val)} validation images, {pool} features of {len(train)} training views")
    return result


def probe_main(argv: list[str] | None = None) -> ProbeResult:
    from jsonargparse import CLI

    return CLI(probe_command, as_positional=False, args=argv)
