"""The periodic monitors' one gate (``mae.training.callbacks.monitor``): when a monitor runs, which processes
evaluate (rank 0, or every process under FSDP2), and the log folder found on every process; the feature
monitors' settings checked when built in Python."""

from types import SimpleNamespace

import pytest

from mae.errors import ConfigError
from mae.training.callbacks import KNNCallback, ProbeCallback
from mae.training.callbacks.monitor import PeriodicMonitor, evaluates_here
from mae.training.sharding import FSDP2Strategy


class Recording(PeriodicMonitor):
    folder = "figures"

    def __init__(self, every_n_epochs: int) -> None:
        super().__init__(every_n_epochs)
        self.epochs: list[int] = []

    def monitor(self, trainer, pl_module, epoch):
        self.epochs.append(epoch)


def _trainer(tmp_path, rank: int = 0, sharded: bool = False, epoch: int = 0, max_epochs: int = 10):
    """What the gate reads of a trainer, at the end of (0-based) ``epoch`` on process ``rank``."""
    log_dirs = []

    class Trainer(SimpleNamespace):
        @property
        def log_dir(self):  # a collective in Lightning: every process must ask
            log_dirs.append(rank)
            return str(tmp_path)

    trainer = Trainer(
        is_global_zero=rank == 0,
        strategy=FSDP2Strategy() if sharded else object(),
        current_epoch=epoch,
        max_epochs=max_epochs,
        max_steps=-1,
        global_step=epoch * 5,
        should_stop=False,
        default_root_dir=str(tmp_path),
    )
    return trainer, log_dirs


@pytest.mark.parametrize(
    "rank, sharded, here", [(0, False, True), (1, False, False), (0, True, True), (1, True, True)]
)
def test_evaluates_here__rank_zero_alone_or_every_process_under_fsdp2(tmp_path, rank, sharded, here):
    assert evaluates_here(_trainer(tmp_path, rank, sharded)[0]) is here


@pytest.mark.parametrize("rank, sharded, runs", [(0, False, True), (1, False, False), (1, True, True)])
def test_periodic_monitor__every_process_finds_the_folder_and_the_chosen_ones_evaluate(
    tmp_path, rank, sharded, runs
):
    monitor = Recording(every_n_epochs=2)
    trainer, log_dirs = _trainer(tmp_path, rank, sharded, epoch=1)
    monitor.on_train_epoch_end(trainer, None)
    assert monitor.epochs == ([2] if runs else []) and log_dirs == [rank]
    assert monitor.out_dir == tmp_path / "figures"


def test_periodic_monitor__runs_every_n_epochs_and_after_the_last_only(tmp_path):
    monitor = Recording(every_n_epochs=4)
    for epoch in range(6):
        trainer, log_dirs = _trainer(tmp_path, epoch=epoch, max_epochs=6)
        monitor.on_train_epoch_end(trainer, None)
    assert monitor.epochs == [4, 6]
    off = Recording(every_n_epochs=0)
    trainer, log_dirs = _trainer(tmp_path, epoch=9, max_epochs=10)
    off.on_train_epoch_end(trainer, None)
    assert off.epochs == [] and log_dirs == []  # not due: no collective either


@pytest.mark.parametrize(
    "monitor, settings, refused",
    [
        (KNNCallback, {"k": 0}, r"^knn.k must be at least 1, got 0$"),
        (KNNCallback, {"max_val": -3}, r"^knn.max_val must be at least 1, got -3$"),
        (ProbeCallback, {"every_n_epochs": -1}, r"^probe.every_n_epochs must be .*, got -1$"),
        (ProbeCallback, {"patience": 0}, r"^probe.patience must be at least 1, got 0$"),
    ],
)
def test_feature_monitor__a_setting_built_in_python_is_checked_by_its_annotation(monitor, settings, refused):
    with pytest.raises(ConfigError, match=refused):
        monitor(**settings)


def test_knn_monitor__a_feature_block_the_encoder_lacks_fails_when_the_run_starts():
    from types import SimpleNamespace

    from mae.errors import ConfigError
    from mae.training.callbacks.knn import KNNCallback
    from tests.helpers import tiny_mae

    module = SimpleNamespace(encoder=tiny_mae())  # 2 blocks
    KNNCallback(feature_blocks=[0, -1]).on_fit_start(None, module)
    with pytest.raises(ConfigError, match=r"knn.feature_blocks 2 is not a block of this encoder of depth 2"):
        KNNCallback(feature_blocks=[2]).on_fit_start(None, module)
    KNNCallback(every_n_epochs=0, feature_blocks=[2]).on_fit_start(None, module)  # off: not checked
