"""``mae pretrain --config CONFIG --find_batch_size true``: the largest batch per device that fits, found
with Lightning's ``Tuner.scale_batch_size``, and the lr the paper's rule gives for it; nothing is written."""

import tempfile

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.tuner import Tuner

from mae.compat.lightning import set_scratch_root
from mae.errors import ConfigError, UsageError
from mae.training.optim import effective_batch_size, scaled_lr


def find_batch_size(cli: LightningCLI, ckpt_path: str | None, max_trials: int) -> int:
    """Try the configured ``data.batch_size``, then twice it, ... (Lightning's power scaling, a few steps
    each) until a batch runs out of memory, ``max_trials`` sizes are tried or the batch is the whole
    training split; print the largest that fitted and its lr (``lr = base_lr x batch x accumulate x
    devices / 256``, ``mae.training.optim.scaled_lr``). Returns that batch size.

    Nothing is written: no run folder, metrics, config or checkpoint (the callbacks and loggers are left
    out; the Tuner's temporary checkpoint lives in a temporary folder removed however the search ends).
    On CPU nothing runs out of memory: the search stops at ``max_trials`` or the split's size.

    Raises:
        UsageError: ``--ckpt_path`` given as well (the search trains from the configured start).
        ConfigError: more than one device (Lightning searches on one: the batch is per device).
    """
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    if ckpt_path is not None:
        raise UsageError("--find_batch_size: leave out --ckpt_path (the search does not resume a run)")
    if trainer.num_devices * trainer.num_nodes > 1:
        raise ConfigError(
            f"--find_batch_size: searches on one device (the batch is per device); set trainer.devices: 1 "
            f"and trainer.num_nodes: 1, got {trainer.num_devices} device(s) x {trainer.num_nodes} node(s)"
        )
    start = data.batch_size
    trainer.loggers, trainer.callbacks = [], []
    with tempfile.TemporaryDirectory(prefix="mae-find-batch-size-") as scratch:
        set_scratch_root(trainer, scratch)  # where the Tuner's temporary checkpoint goes
        found = Tuner(trainer).scale_batch_size(
            model, datamodule=data, mode="power", init_val=start, max_trials=max_trials
        )
    accumulate = trainer.accumulate_grad_batches
    effective = effective_batch_size(found, accumulate=accumulate)
    lr = scaled_lr(model.optim.base_lr, effective)
    rule = f"{model.optim.base_lr:g} x {found} x {accumulate} accumulation x 1 device / 256"
    given = "" if model.optim.lr is None else f"; model.optim.lr {model.optim.lr:g} is set and used instead"
    print(
        f"largest batch that fits: data.batch_size {found} per device (tried from {start}, doubling, at "
        f"most {max_trials} tries; the training split's size also ends the search, and on CPU, where "
        "nothing runs out of memory, only these do)\n"
        f"lr by the paper's rule: {lr:.4g} = base_lr {rule} (N devices: N x that){given}",
        flush=True,
    )
    return found
