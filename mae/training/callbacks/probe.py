"""The fast linear probe as a pretraining monitor, next to the kNN one."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only

from mae.data import fixed_subset
from mae.eval.probe import (
    DEFAULT_LRS,
    DEFAULT_WEIGHT_DECAYS,
    FeatureStore,
    Pool,
    check_grid,
    check_training,
    pooled,
    train_probe,
)


class ProbeCallback(pl.Callback):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/probe_acc1`` / ``val/probe_acc5``:
    the linear probe on the encoder's frozen features (``mae.eval.probe``), trained on the data
    module's training split (evaluation view), scored on its validation split. Runs on global rank
    0 only; skipped when the data has no validation split.

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        pool: "cls", "avg" or "both".
        lrs, weight_decays: the grid (default: ``mae.eval.probe.DEFAULT_LRS`` / ``DEFAULT_WEIGHT_DECAYS``).
        max_epochs, patience: the heads' training cap and early stop.
        max_train: training-split size cap (a fixed random subset).
    """

    def __init__(
        self,
        every_n_epochs: int = 0,
        pool: Pool = "cls",
        lrs: list[float] | None = None,
        weight_decays: list[float] | None = None,
        max_epochs: int = 100,
        patience: int = 10,
        max_train: int = 50_000,
    ) -> None:
        if every_n_epochs < 0:
            raise ValueError(f"probe.every_n_epochs must be >= 0, got {every_n_epochs}")
        check_training(max_epochs, patience, holdout=0.1)
        self.grid = {
            "lrs": tuple(lrs or DEFAULT_LRS),
            "weight_decays": tuple(DEFAULT_WEIGHT_DECAYS if weight_decays is None else weight_decays),
        }
        check_grid(list(self.grid["lrs"]), list(self.grid["weight_decays"]))
        pooled(torch.nn.Identity(), pool)  # a bad pool name fails now
        self.every_n_epochs, self.pool, self.max_epochs, self.patience = every_n_epochs, pool, max_epochs, patience
        self.max_train = max_train

    @rank_zero_only
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        if not self.every_n_epochs or (epoch % self.every_n_epochs and epoch != trainer.max_epochs):
            return
        datamodule = trainer.datamodule
        if getattr(datamodule, "val_set", None) is None:
            return
        train_set, val_set = datamodule.feature_datasets()
        train_set = fixed_subset(train_set, self.max_train)
        model = pl_module.model
        was_training = model.training
        model.eval()
        encode = pooled(model, self.pool)
        # Loaders draw seeds from the global RNG: fork it, so monitoring never changes the training run.
        with torch.random.fork_rng(devices=[pl_module.device] if pl_module.device.type == "cuda" else []):
            args = (datamodule.batch_size, datamodule.num_workers, pl_module.device)
            train, val = FeatureStore.extract(encode, train_set, *args), FeatureStore.extract(encode, val_set, *args)
            result = train_probe(train, val, datamodule.num_labels, max_epochs=self.max_epochs,
                                 patience=self.patience, **self.grid)  # fmt: skip
        model.train(was_training)
        pl_module.log_dict({"val/probe_acc1": result.val_acc1, "val/probe_acc5": result.val_acc5}, rank_zero_only=True)
