"""Everything the tests share: tiny model sizes, in-memory data modules, a Lightning trainer for
module tests, running the entry points as subprocesses, and writers of small image folders and
CIFAR-format files."""

import csv
import io
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import yaml
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD

REPO = Path(__file__).resolve().parents[1]

# MaskedAutoencoderViT arguments of a 32x32 model small enough for exact comparisons.
TINY = dict(
    img_size=32,
    patch_size=4,
    embed_dim=64,
    depth=2,
    num_heads=4,
    decoder_embed_dim=32,
    decoder_depth=2,
    decoder_num_heads=4,
)
# model_kwargs of the smallest trainable mae_vit_tiny_patch4 (pretraining module tests).
TINY_KWARGS = dict(
    embed_dim=32, depth=1, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2
)
# The ``model:`` section of a CLI config with that model.
TINY_MODEL = {"model": "mae_vit_tiny_patch4", "model_kwargs": TINY_KWARGS, "optim": {"warmup_epochs": 1}}
# model_kwargs of a two-block encoder and decoder: enough blocks for a cross decoder to read two layers.
TWO_BLOCK_KWARGS = dict(
    embed_dim=32, depth=2, num_heads=2, decoder_embed_dim=32, decoder_depth=2, decoder_num_heads=2
)
# Command-line overrides that put a recipe's trainer on one CPU device in full precision.
CPU_TRAINER = [
    "--trainer.accelerator",
    "cpu",
    "--trainer.devices",
    "1",
    "--trainer.strategy",
    "auto",
    "--trainer.precision",
    "32-true",
]
# A timing benchmark's flags at their smallest: one warm-up and one timed step, two interleaved rounds.
ONE_TIMED_STEP = ["--warmup", "1", "--steps", "1", "--rounds", "2"]
# The decoder switches of each variant (``mae.models.decoder_switches``), on ``TINY``'s two blocks.
DECODER_VARIANTS = {
    "partial": dict(decoder_keep_ratio=0.25),
    "cross": dict(decoder_type="cross"),
    "cross_partial": dict(decoder_type="cross", decoder_keep_ratio=0.25),
    "cross_layers": dict(decoder_type="cross", decoder_encoder_layers=[0, -1]),
}


def tiny_mae(seed: int = 0, **kwargs):
    """A seeded ``TINY`` model of the class its decoder switches (``kwargs``) name (``build_mae``)."""
    from mae.models import build_mae

    torch.manual_seed(seed)
    return build_mae(**TINY, **kwargs)


class RandomImages(pl.LightningDataModule):
    """``n`` random (3, 16, 16) float images with label 0."""

    def __init__(self, n: int = 40, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.zeros(n, dtype=torch.long))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class LabelledImages(RandomImages):
    """``RandomImages`` labelled ``i % num_classes``."""

    def __init__(self, n: int = 40, batch_size: int = 4, num_classes: int = 3) -> None:
        super().__init__(n, batch_size)
        self.data.tensors = (self.data.tensors[0], torch.arange(n) % num_classes)


class RecordLR(pl.Callback):
    """The first parameter group's lr at every training batch."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def official_lr(epoch: float, lr: float, min_lr: float, warmup_epochs: float, epochs: float) -> float:
    """The official MAE schedule at a fractional epoch: the independent reference of the schedule tests."""
    if epoch < warmup_epochs:
        return lr * epoch / warmup_epochs
    return min_lr + (lr - min_lr) * 0.5 * (
        1.0 + math.cos(math.pi * (epoch - warmup_epochs) / (epochs - warmup_epochs))
    )


def with_defaults(defaults: dict, kwargs: dict) -> dict:
    """``kwargs`` over ``defaults``; a settings group given as a dict (``optim``, ``kernels``, ``encoder``)
    over the default's, as a config file's keys would be."""
    groups = {
        k: {**defaults[k], **v}
        for k, v in kwargs.items()
        if k in GROUPS and isinstance(v, dict) and k in defaults
    }
    return {**defaults, **kwargs, **groups}


GROUPS = ("optim", "kernels", "encoder")


def pretrain_module(**kwargs):
    """A seeded tiny ``MAEPretrainModule`` for 16x16 inputs."""
    from mae.training.pretrain import MAEPretrainModule

    torch.manual_seed(0)
    defaults = dict(
        model="mae_vit_tiny_patch4", img_size=16, model_kwargs=TINY_KWARGS, optim=dict(warmup_epochs=1)
    )
    return MAEPretrainModule(**with_defaults(defaults, kwargs))


# A 3-block encoder for fine-tuning tests: enough blocks to tell layer-decay scales apart.
FINETUNE_KWARGS = dict(
    embed_dim=32, depth=3, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2
)


def finetune_module(**kwargs):
    """A seeded ``MAEFinetuneModule`` from scratch: 3 classes, 16x16 inputs."""
    from mae.training.finetune import MAEFinetuneModule

    torch.manual_seed(0)
    encoder = dict(model="mae_vit_tiny_patch4", model_kwargs=FINETUNE_KWARGS)
    defaults = dict(encoder=encoder, img_size=16, num_classes=3, optim=dict(warmup_epochs=0))
    return MAEFinetuneModule(**with_defaults(defaults, kwargs))


def make_trainer(tmp_path, **kwargs) -> pl.Trainer:
    """A quiet CPU trainer: no logger, checkpoints, progress bar or sanity check unless asked."""
    defaults = dict(
        default_root_dir=tmp_path,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return pl.Trainer(**{**defaults, **kwargs})


def tiny_pretraining_checkpoint(folder: Path, steps: int = 2, **module_kwargs) -> Path:
    """``folder/last.ckpt``: our pretraining checkpoint of the tiny model (16x16 inputs; target norm_pix, or
    as ``module_kwargs`` say) after ``steps`` steps on ``RandomImages``.

    Trained once a test session for each ``steps`` and ``module_kwargs``; a later call writes the same bytes
    again, a file of the caller's own, and leaves torch's random state as the training did (the training is
    seeded: a second one writes the file byte for byte and ends in the same state).
    """
    key = repr((steps, sorted(module_kwargs.items())))
    folder.mkdir(parents=True, exist_ok=True)
    if key in _TINY_CHECKPOINTS:
        data, rng = _TINY_CHECKPOINTS[key]
        (folder / "last.ckpt").write_bytes(data)
        torch.set_rng_state(rng)
        return folder / "last.ckpt"
    module = pretrain_module(optim=dict(warmup_epochs=0), **module_kwargs)
    trainer = make_trainer(folder, max_steps=steps, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages())
    trainer.save_checkpoint(folder / "last.ckpt")
    _TINY_CHECKPOINTS[key] = ((folder / "last.ckpt").read_bytes(), torch.get_rng_state())
    return folder / "last.ckpt"


# tiny_pretraining_checkpoint's files and torch's random state after them, by their arguments, as trained
# this session (a few hundred KiB each).
_TINY_CHECKPOINTS: dict[str, tuple[bytes, torch.Tensor]] = {}


def untrained_cnn_checkpoint(path: Path, encoder: str = "resnet10t", seed: int = 0) -> Path:
    """``path``: a pretraining checkpoint as ``mae pretrain`` writes one (its architecture record, its state
    dict under ``model.``) of a ``MaskedAutoencoderCNN`` on the timm ``encoder`` at 32 px (mask unit 8, spark
    decoder 64 wide), at its seeded initialisation: for the CNN's loading paths, in milliseconds."""
    from mae.convert.architecture import mae_record
    from mae.models import create_model

    torch.manual_seed(seed)
    model = create_model("spark", encoder=encoder, img_size=32, mask_unit=8, decoder_width=64)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    record = mae_record(model.config)
    torch.save(
        {"state_dict": state, "pytorch-lightning_version": pl.__version__, "mae_architecture": record}, path
    )
    return path


def csv_logger(tmp: Path, name: str) -> dict:
    """The ``trainer.logger`` entry of a CLI config: CSV metrics under ``tmp/runs/<name>``."""
    return {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(tmp / "runs"), "name": name},
    }


def cli_trainer(tmp: Path, name: str, **more) -> dict:
    """The ``trainer`` section of a CLI config: one CPU device, no progress bar, every step logged as CSV
    under ``tmp/runs/<name>`` (``csv_logger``); ``more`` (``max_epochs``, ``precision``, ...) over it."""
    return {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "log_every_n_steps": 1,
        "logger": csv_logger(tmp, name),
        **more,
    }


def folder_data(root: Path, img_size: int = 16, **more) -> dict:
    """The ``data`` section of a CLI config: the image folder ``root``, batches of 4 read in the main
    process; ``more`` (``val_split``, ...) over its arguments."""
    args = {"root": str(root), "img_size": img_size, "batch_size": 4, "num_workers": 0, **more}
    return {"class_path": "mae.data.ImageFolderDataModule", "init_args": args}


def folder_flags(root: Path, img_size: int = 16, **more) -> list[str]:
    """``folder_data`` as command-line flags (``--data.class_path ... --data.root ROOT ...``)."""
    data = folder_data(root, img_size, **more)
    flags = ["--data.class_path", data["class_path"]]
    for key, value in data["init_args"].items():
        flags += [f"--data.{key}", str(value)]
    return flags


def tiny_pretrain_config(tmp: Path, name: str, **sections) -> dict:
    """A CLI config of one seeded epoch of the tiny model (``TINY_MODEL``, no warm-up) on the image folder
    ``tmp/data`` (``folder_data``), logged as CSV under ``tmp/runs/<name>`` (``cli_trainer``); ``sections``
    (``reconstruction``, ``tracker``, a whole ``model``, ...) over it."""
    return {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": folder_data(tmp / "data"),
        "trainer": cli_trainer(tmp, name, max_epochs=1),
        **sections,
    }


def tiny_pretraining_run(tmp: Path, name: str, **sections) -> tuple[Path, Path]:
    """``mae pretrain`` of ``tiny_pretrain_config(tmp, name, **sections)`` on new image folders
    (``write_train_val_folders(tmp / "data")``): (its config file, its run folder
    ``tmp/runs/<name>/version_0``)."""
    write_train_val_folders(tmp / "data")
    config = write_config(tmp, tiny_pretrain_config(tmp, name, **sections), name)
    run_mae("pretrain", "--config", str(config))
    return config, tmp / "runs" / name / "version_0"


def tensorboard_tracker(save_dir: Path) -> dict:
    """The ``tracker`` entry of a CLI config: TensorBoard (the shipped recipe's settings) under
    ``save_dir``."""
    return {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(save_dir), "log_graph": False, "default_hp_metric": False},
    }


def tensorboard_events(log_dir: Path):
    """TensorBoard's own reader (``EventAccumulator``) over ``log_dir``, loaded, nothing sampled away."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def write_config(tmp: Path, config: dict, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _command(command: str) -> list[str]:
    """``python -m mae <command>``: what the ``mae`` console script runs."""
    return ["-m", "mae", command]


def _with_config(
    args: tuple[str, ...], argv: list[str], config: dict | None, tmp: Path | None
) -> tuple[str, ...]:
    if config is None:
        return args
    path = write_config(tmp, config, f"{argv[-1]}-{len(list(tmp.glob('*.yaml')))}")
    return ("--config", str(path), *args)


def _checked(result: subprocess.CompletedProcess, check: bool) -> subprocess.CompletedProcess:
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def run_mae(
    command: str,
    *args: str,
    config: dict | None = None,
    tmp: Path | None = None,
    timeout: int = 300,
    check: bool = True,
    env: dict | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``mae <command> [--config <config as YAML in tmp>] *args`` (as ``python -m mae``) in the
    repository, as a forked child of an interpreter that has imported the project
    (``tests.forked_commands``: a second, not the import's 6); with ``fresh``, in a fresh interpreter
    (``run_mae_process``).

    ``command`` is a subcommand (``pretrain``, ``knn``, ...); ``env`` replaces the environment; with
    ``check`` a non-zero exit fails the test, showing the output's tail. A test about the process
    itself (signals, DDP, the interpreter's start-up) uses ``run_mae_process``.
    """
    argv = _command(command)
    args = _with_config(args, argv, config, tmp)
    if fresh:
        result = subprocess.run(
            [sys.executable, *argv, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
        )
    else:
        from tests.forked_commands import run_forked

        result = run_forked([*argv, *args], REPO, timeout, env)
    return _checked(result, check)


def start_mae(
    command: str, *args: str, env: dict | None = None, new_session: bool = False, sigint_ignored: bool = False
):
    """``run_mae`` started, not waited for: a ``tests.forked_commands.ForkedProcess`` (``Popen``'s
    ``wait``, ``send_signal``, ``communicate``, and ``wait_for_output``), to signal it; with
    ``new_session``, the leader of a process group of its own, as a scheduler starts a job; with
    ``sigint_ignored``, started as a script's background job (SIGINT ignored). Use it in a ``with`` block: a
    child still running when the test ends is killed."""
    from tests.forked_commands import ForkedProcess

    return ForkedProcess([*_command(command), *args], REPO, env, new_session, sigint_ignored)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_task_env(rank: int, tasks: int, nodes: int, port: int) -> dict[str, str]:
    """The variables ``srun`` gives task ``rank`` of a job of ``tasks`` tasks on ``nodes`` nodes, which
    Lightning's ``SLURMEnvironment`` reads (no SLURM needed); the rendezvous on 127.0.0.1:``port``."""
    per_node = tasks // nodes
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "mae",
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(tasks),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_NODEID": str(rank // per_node),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "MASTER_PORT": str(port),
    }


def start_slurm_tasks(command: str, *args: str, tasks: int = 2, env: dict | None = None) -> list:
    """``mae <command> ARGS`` as the ``tasks`` tasks of one SLURM job on one node (``slurm_task_env``),
    each forked as ``start_mae`` forks (no fresh interpreter: a multi-process run at a third of the cost of
    Lightning's own launcher, which starts every other rank as a new ``python``), each the leader of a
    process group of its own. Use them in a ``with`` block each (``contextlib.ExitStack``)."""
    import os

    port = free_port()
    base = dict(env if env is not None else os.environ)
    return [
        start_mae(command, *args, env={**base, **slurm_task_env(rank, tasks, 1, port)}, new_session=True)
        for rank in range(tasks)
    ]


def run_slurm_tasks(
    command: str, *args: str, tasks: int = 2, env: dict | None = None, timeout: int = 300, check: bool = True
) -> tuple[list[int], str]:
    """``start_slurm_tasks`` waited for: (each task's exit status, their outputs joined); with ``check``, a
    task that fails fails the test, showing the output's tail."""
    import contextlib

    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(task) for task in start_slurm_tasks(command, *args, tasks=tasks, env=env)
        ]
        output = "\n".join("".join(task.communicate(timeout=timeout)) for task in started)
    codes = [task.returncode for task in started]
    assert not check or codes == [0] * tasks, f"exit statuses {codes}:\n{output[-4000:]}"
    return codes, output


def run_mae_process(command: str, *args: str, **options) -> subprocess.CompletedProcess:
    """``run_mae`` in a fresh interpreter (``subprocess.run``): what a user's shell starts; ``options`` as
    ``run_mae``'s."""
    return run_mae(command, *args, fresh=True, **options)


def read_metrics(run_dir: Path) -> list[dict]:
    """Rows of a run's ``metrics.csv``."""
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def write_image_folder(root: Path, classes: list[str], per_class: int, size=(40, 30), seed: int = 0) -> Path:
    """root/<class>/<i>.jpg with random JPEGs (different sizes allowed by ``size``)."""
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"img_{i:03d}.jpg", quality=90)
    return root


def write_train_val_folders(root: Path, classes=("a", "b", "c"), train: int = 4, val: int = 2) -> Path:
    """``root/train`` and ``root/val`` (``write_image_folder``): ``train`` and ``val`` random 40x30 JPEGs
    a class, the validation ones from another seed; ``root``, the ``data.root`` of a pretraining run."""
    write_image_folder(root / "train", list(classes), per_class=train)
    write_image_folder(root / "val", list(classes), per_class=val, seed=1)
    return root


def write_smooth_jpeg(path, size=(500, 375)):
    """A photo-like JPEG (smooth gradients plus texture), so resampling differences stay small."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    pixels = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h) + 64], -1)
    pixels = np.clip(pixels + rng.normal(0, 8, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90)
    return path


def jpeg_bytes(seed: int, size=(48, 36)) -> bytes:
    """A JPEG of random pixels, ``size`` (W, H), as bytes."""
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=90
    )
    return buffer.getvalue()


def write_npy_header(path: Path, shape, dtype: str = "<f4", payload: bytes = b"") -> Path:
    """An ``.npy`` file whose header says ``shape`` (any, even negative), followed by ``payload``."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
        )
        f.write(payload)
    return path


def write_cifar(
    root: Path, name: str = "cifar10", train_per_batch: int = 10, test: int = 10, seed: int = 0
) -> Path:
    """The standard python-pickle layout of CIFAR-10 / CIFAR-100, with random pixels."""
    rng = np.random.default_rng(seed)
    num_classes = 10 if name == "cifar10" else 100

    def dump(path: Path, n: int, label_key: str) -> None:
        entry = {
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            label_key: rng.integers(0, num_classes, n).tolist(),
        }
        with open(path, "wb") as f:
            pickle.dump(entry, f)

    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(1, 6):
            dump(folder / f"data_batch_{i}", train_per_batch, "labels")
        dump(folder / "test_batch", test, "labels")
        meta = {"label_names": [f"class{i}" for i in range(10)]}
        meta_file = folder / "batches.meta"
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        dump(folder / "train", 5 * train_per_batch, "fine_labels")
        dump(folder / "test", test, "fine_labels")
        meta = {"fine_label_names": [f"class{i}" for i in range(100)]}
        meta_file = folder / "meta"
    with open(meta_file, "wb") as f:
        pickle.dump(meta, f)
    return root


ID_SIDE = 8  # id images are ID_SIDE x ID_SIDE and one colour, which any crop and resize keeps


def write_id_images(root: Path, count: int, classes: int = 2, split: str = "train", first: int = 0) -> Path:
    """root/<split>/<class>/<id>.png for ids ``first ... first + count - 1``: image ``id`` is one colour,
    red 4 * (id % 64), green 4 * (id // 64), so every view of it (crop, resize, flip) names it; labels
    cycle through ``classes``."""
    for i in range(first, first + count):
        folder = root / split / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.zeros((ID_SIDE, ID_SIDE, 3), np.uint8)
        pixels[..., 0], pixels[..., 1] = 4 * (i % 64), 4 * (i // 64)
        Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    return root


def image_ids(imgs: torch.Tensor) -> list[int]:
    """The ids of a normalised batch of id images (``write_id_images``)."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    pixels = ((imgs.float() * std + mean) * 255).mean(dim=(2, 3))
    return [round(r / 4) + 64 * round(g / 4) for r, g in pixels[:, :2].tolist()]


class RecordIds(pl.LightningModule):
    """Records (epoch, image id) of every training and validation sample; a zero-lr linear layer gives
    a loss."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, int]] = []
        self.val_seen: list[tuple[int, int]] = []

    def validation_step(self, batch, batch_idx):
        self.val_seen += [(self.current_epoch, i) for i in image_ids(batch[0])]

    def training_step(self, batch, batch_idx):
        imgs, _ = batch
        self.seen += [(self.current_epoch, i) for i in image_ids(imgs)]
        return self.layer(imgs.float().mean(dim=(1, 2, 3))[:, None]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class PrintIds(pl.Callback):
    """Prints ``IDS rank <global rank> epoch <epoch>: <id> <id> ...`` before every training batch of id
    images (``write_id_images``), on every process: a test reads which images each process of a
    distributed run trained on from that process's output (a file would be one more write to check)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        ids = " ".join(str(i) for i in image_ids(batch[0].cpu()))
        print(f"IDS rank {trainer.global_rank} epoch {trainer.current_epoch}: {ids}", flush=True)


class PauseAt(pl.Callback):
    """Prints ``PAUSE <moment>`` once (rank 0) and sleeps ``seconds``, so that a test can signal the
    process right there: ``step`` (before training step ``step``), ``validation`` (inside the first
    validation after training began), ``save`` (inside a checkpoint save), ``loader`` (at the start of
    epoch 1, while its loader workers start)."""

    def __init__(self, moment: str, seconds: float = 1.5, step: int = 2) -> None:
        self.moment, self.seconds, self.step = moment, seconds, step
        self.done = False

    def _pause(self, trainer: pl.Trainer, moment: str) -> None:
        if self.done or moment != self.moment:
            return
        self.done = True
        if trainer.is_global_zero:
            print(f"PAUSE {moment} step {trainer.global_step}", flush=True)
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            # Short sleeps, as a running step is Python code between short C calls: CPython runs a signal's
            # handler between bytecodes, so a signal that comes as an earlier handler returns would wait
            # for the end of one long C-level sleep.
            time.sleep(0.05)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            self._pause(trainer, "step")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and trainer.global_step > 0:
            self._pause(trainer, "validation")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._pause(trainer, "save")

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            self._pause(trainer, "loader")


class MlflowServer:
    """A real MLflow tracking server on 127.0.0.1 (SQLite backend store, artifacts served from a local
    folder) in ``folder``, the leader of a process group of its own: ``uri``, and ``kill`` (SIGKILL to its
    group: it stops answering at once, as a server that goes down). Use it in a ``with`` block."""

    def __init__(self, folder: Path) -> None:
        import socket

        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "server.log"
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{folder / 'store.db'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--workers",
            "1",
        ]
        # Without MLflow's job runner (GenAI jobs, none used here): 9 more Python processes importing MLflow,
        # half of the server's start-up on 2 cores, and busy beside the run under test.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.uri = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the MLflow server exited: {self.log.read_text()[-3000:]}") from None
                time.sleep(0.2)

    def kill(self) -> None:
        import os
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its workers too; a graceful stop takes seconds
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def __enter__(self) -> "MlflowServer":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


# ------------------------------------------------------------------------------------ hostile pickles


class CreatesFolder:
    """A payload: unpickling it creates the folder ``target`` (``os.mkdir``), so a test can assert that
    nothing ran by the folder's absence."""

    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def _pickled_string(text: str) -> bytes:
    """The pickle opcode that pushes ``text`` (SHORT_BINUNICODE)."""
    data = text.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(data)]) + data


def call_pickle(module: str, name: str, args: tuple[str, ...], stack_global: bool) -> bytes:
    """A protocol-4 pickle, built opcode by opcode, that calls ``module``.``name``(*args): the global named
    by GLOBAL (text) or by STACK_GLOBAL (two strings on the stack), as a hostile file would name it."""
    if stack_global:
        callee = _pickled_string(module) + _pickled_string(name) + pickle.STACK_GLOBAL
    else:
        callee = pickle.GLOBAL + f"{module}\n{name}\n".encode()
    arguments = pickle.MARK + b"".join(_pickled_string(a) for a in args) + pickle.TUPLE
    return pickle.PROTO + b"\x04" + callee + arguments + pickle.REDUCE + pickle.STOP
