"""Each private name of another library that ``mae.compat`` wraps, used once: a release of a dependency
that moves or changes one fails the test named after it, not a user's run."""

import inspect
import logging
import signal

import pytest
import torch
from torch import nn

# ---------------------------------------------------------------------------------------------------
# torch


def test_torch__collate_with_replaces_the_function_of_one_type():
    from mae.compat.torch import collate_with, stack_tensors

    seen = []

    def tensors(batch, **kwargs):
        seen.append(len(batch))
        return stack_tensors(batch, **kwargs)

    images, labels = collate_with([(torch.zeros(2, 3), 0), (torch.ones(2, 3), 1)], {torch.Tensor: tensors})
    assert seen == [2] and images.shape == (2, 2, 3) and labels.tolist() == [0, 1]


def test_torch__iterator_start_hook_runs_around_every_start_of_a_loader():
    from torch.utils.data import DataLoader

    from mae.compat.torch import IteratorStartHook

    class Counting(IteratorStartHook, DataLoader):
        starts = 0

        def start_iterator(self, start):
            self.starts += 1
            return start()

    loader = Counting(list(range(4)), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]] and list(loader) and loader.starts == 2


def test_torch__onnx_opset_range():
    from mae.compat.torch import onnx_opset_range

    lowest, highest = onnx_opset_range()
    assert isinstance(lowest, int) and isinstance(highest, int) and 18 <= lowest <= highest


def test_torch__unscales_in_step_is_the_flag_the_grad_scaler_reads():
    from mae.compat.torch import unscales_in_step

    weights = [nn.Parameter(torch.ones(2))]
    assert unscales_in_step(torch.optim.AdamW(weights, fused=True))
    assert not unscales_in_step(torch.optim.AdamW(weights)) and not unscales_in_step(torch.optim.SGD(weights))
    assert "_step_supports_amp_scaling" in inspect.getsource(torch.amp.GradScaler.step)


def test_torch__load_distributed_checkpoint_fills_the_dict_from_the_checkpoints_index(tmp_path):
    import torch.distributed.checkpoint as dcp

    from mae.compat.torch import EmptyStateDictLoadPlanner, load_distributed_checkpoint

    saved = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step": torch.tensor(7)}
    dcp.save(saved, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True)
    state: dict = {}
    load_distributed_checkpoint(state, dcp.FileSystemReader(tmp_path), EmptyStateDictLoadPlanner())
    assert torch.equal(state["model"]["w"], saved["model"]["w"]) and state["step"].item() == 7
    only: dict = {}
    load_distributed_checkpoint(
        only, dcp.FileSystemReader(tmp_path), EmptyStateDictLoadPlanner(keys={"step"})
    )
    assert set(only) == {"step"}


def test_torch__wrapper_module_names_are_the_ones_wrappers_insert():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp._common_utils import FSDP_WRAPPED_MODULE

    from mae.compat.torch import WRAPPER_MODULE_NAMES

    compiled = [name for name, _ in torch.compile(nn.Linear(2, 2)).named_parameters()]
    checkpointed = [name for name, _ in nn.Sequential(checkpoint_wrapper(nn.Linear(2, 2))).named_parameters()]
    assert (
        compiled[0].split(".")[0] == "_orig_mod"
        and checkpointed[0].split(".")[1] == "_checkpoint_wrapped_module"
    )
    assert set(WRAPPER_MODULE_NAMES) == {FSDP_WRAPPED_MODULE, "_orig_mod", "_checkpoint_wrapped_module"}


# ---------------------------------------------------------------------------------------------------
# Lightning


def _trainer(**kwargs):
    import lightning.pytorch as pl

    settings = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False)
    return pl.Trainer(**{"enable_progress_bar": False, **settings, **kwargs})


def test_lightning__installed_signal_connector_handles_sigterm():
    from mae.compat.lightning import SignalConnector, install_signal_connector, signal_connector

    class Recording(SignalConnector):
        signals: list = []

        def on_sigterm(self, signum):
            self.signals.append(signum)
            super().on_sigterm(signum)

    trainer = _trainer()
    connector = Recording(trainer)
    install_signal_connector(trainer, connector)
    assert signal_connector(trainer) is connector and not trainer.received_sigterm
    previous = signal.getsignal(signal.SIGTERM)
    connector.register_signal_handlers()
    try:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # Lightning's composed handler
    finally:
        connector.teardown()
    assert signal.getsignal(signal.SIGTERM) == previous
    assert connector.signals == [signal.SIGTERM] and trainer.received_sigterm  # Lightning's handler ran too


def test_lightning__set_data_parallel_only_sets_the_sizes_the_device_mesh_is_built_from():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from mae.compat.lightning import set_data_parallel_only

    strategy = ModelParallelStrategy()
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == ("auto", "auto")
    set_data_parallel_only(strategy, 4)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)
    mesh = inspect.getsource(ModelParallelStrategy.setup_environment)
    assert "self._data_parallel_size, self._tensor_parallel_size" in mesh  # what _setup_device_mesh takes


def test_lightning__a_handler_set_like_lightnings_is_restored_by_teardown():
    from mae.compat.lightning import SignalConnector

    connector = SignalConnector(_trainer())
    previous = signal.getsignal(signal.SIGINT)
    connector.register_signal_handlers()
    try:
        connector.set_handler(signal.SIGINT, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        connector.teardown()
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.parametrize("kind", ["csv", "tensorboard"])
def test_lightning__a_versioned_loggers_version_is_set_before_first_use(kind, tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from mae.compat.lightning import keeps_versions, set_version, version_chosen

    logger = {"csv": CSVLogger, "tensorboard": TensorBoardLogger}[kind](tmp_path)
    assert keeps_versions(logger) and not version_chosen(logger) and not keeps_versions(None)
    set_version(logger, 3)
    assert version_chosen(logger) and logger.version == 3 and logger.log_dir.endswith("version_3")


def test_lightning__format_summary_table_is_what_model_summary_logs():
    from lightning.pytorch.callbacks import ModelSummary
    from lightning.pytorch.callbacks.model_summary import log

    from mae.compat.lightning import format_summary_table

    columns = [(" ", ["0"]), ("Name", ["layer"]), ("Type", ["Linear"]), ("Params", ["6"])]
    table = format_summary_table(6, 6, 0.000024, {"train": 1, "eval": 0}, 0, *columns)
    assert "layer" in table and "Total params" in table
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log.addHandler(handler)
    try:
        ModelSummary.summarize(columns, 6, 6, 0.000024, {"train": 1, "eval": 0}, 0)
    finally:
        log.removeHandler(handler)
    assert [record.getMessage() for record in records] == ["\n" + table]


def test_lightning__described_rich_progress_bar_names_the_training_bar():
    pytest.importorskip("rich")
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from mae.compat.lightning import DescribedRichProgressBar

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Recording(DescribedRichProgressBar):
        epochs: list = []

        def train_description(self, current_epoch):
            self.epochs.append(current_epoch)
            return super().train_description(current_epoch)

    bar = Recording()
    _trainer(max_epochs=1, callbacks=[bar], enable_progress_bar=True).fit(
        Model(), DataLoader(torch.ones(2, 2))
    )
    assert bar.epochs and set(bar.epochs) == {0}
    assert bar.train_description(0).startswith("Epoch 0/0")


# ---------------------------------------------------------------------------------------------------
# timm


def test_timm__embed_positions_is_the_start_of_forward_features():
    from timm.models.vision_transformer import VisionTransformer

    from mae.compat.timm import embed_positions

    torch.manual_seed(0)
    vit = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=16, depth=0, num_heads=2, dynamic_img_size=True
    )
    vit.eval()
    images = torch.randn(2, 3, 40, 48)
    tokens = embed_positions(vit, vit.patch_embed(images))
    assert tokens.shape == (2, 1 + 5 * 6, 16)
    torch.testing.assert_close(vit.norm(vit.norm_pre(tokens)), vit.forward_features(images))


# ---------------------------------------------------------------------------------------------------
# litdata


@pytest.fixture(scope="module")
def tiny_stream(tmp_path_factory):
    from litdata.streaming.cache import Cache

    folder = tmp_path_factory.mktemp("stream")
    cache = Cache(input_dir=str(folder), chunk_size=2)
    for index in range(4):
        cache[index] = index
    cache.done()
    cache.merge()
    return str(folder)


def test_litdata__read_whole_chunks_reaches_the_reader_built_later_and_the_one_built(tiny_stream, tmp_path):
    from litdata import StreamingDataset

    from mae.compat.litdata import read_whole_chunks

    dataset = StreamingDataset(tiny_stream, cache_dir=str(tmp_path))
    read_whole_chunks(dataset)
    assert dataset.cache is None and dataset.on_demand_bytes is False
    assert dataset[1] == 1 and dataset.cache._reader.on_demand_bytes is False
    dataset.on_demand_bytes = True  # what litdata does after an epoch
    read_whole_chunks(dataset)
    assert dataset.cache._reader.on_demand_bytes is False and dataset.on_demand_bytes is False


def test_litdata__streaming_loader_starts_its_iterator_through_the_hook(tiny_stream, tmp_path):
    from litdata import StreamingDataLoader, StreamingDataset

    from mae.compat.torch import IteratorStartHook

    class Counting(IteratorStartHook, StreamingDataLoader):
        starts = 0

        def start_iterator(self, start):
            self.starts += 1
            return start()

    loader = Counting(StreamingDataset(tiny_stream, cache_dir=str(tmp_path)), batch_size=2)
    assert sorted(int(x) for batch in loader for x in batch) == [0, 1, 2, 3] and loader.starts == 1


def test_litdata__allow_http_downloads_sets_the_obstore_client_option(monkeypatch):
    from litdata.streaming import downloader

    from mae.compat.litdata import allow_http_downloads

    monkeypatch.setattr(downloader, "_OBSTORE_CLIENT_OPTIONS", dict(downloader._OBSTORE_CLIENT_OPTIONS))
    allow_http_downloads()
    assert downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] == "true"
    assert "client_options=_OBSTORE_CLIENT_OPTIONS" in inspect.getsource(downloader)  # what S3Store is given


# ---------------------------------------------------------------------------------------------------
# Lightning's loggers (the experiment trackers)


def test_lightning__flatten_params_is_how_the_loggers_log_nested_settings():
    from argparse import Namespace

    from mae.compat.lightning import flatten_params

    flat = flatten_params({"run": {"lr": 0.1, "model": Namespace(depth=2)}, "name": "x"})
    assert flat == {"run/lr": 0.1, "run/model/depth": 2, "name": "x"}


def test_lightning__tensorboard_param_values_are_what_its_logger_accepts():
    import numpy as np

    from mae.compat.lightning import tensorboard_param_values

    values = tensorboard_param_values({"steps": np.int64(3), "sizes": [1, 2], "name": "x", "on": True})
    assert values == {"steps": 3, "sizes": "[1, 2]", "name": "x", "on": True} and type(values["steps"]) is int


def test_lightning__mlflow_run_started_once_the_logger_makes_its_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    from mae.compat.lightning import mlflow_run_started

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the quickest store to make: a folder
    logger = MLFlowLogger(experiment_name="compat", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    assert not mlflow_run_started(logger)
    assert logger.run_id and mlflow_run_started(logger)


def test_lightning__wandb_run_started_once_the_logger_starts_its_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    from mae.compat.lightning import wandb_run_started

    for variable in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path))
    logger = WandbLogger(save_dir=str(tmp_path), mode="disabled", project="compat")
    assert not wandb_run_started(logger)
    assert logger.experiment is not None and wandb_run_started(logger)


def test_lightning__load_from_checkpoint_rebuilds_with_an_allowed_instantiator(tmp_path):
    import lightning.pytorch as pl

    from mae.compat.lightning import INSTANTIATOR_KEY, allow_instantiator, instantiator_allowed

    class Module(pl.LightningModule):
        def __init__(self, width: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = nn.Linear(width, 1)

    built = []

    def instantiate(module_class, hparams):
        built.append(hparams)
        return module_class(width=hparams["width"])

    globals()["_compat_instantiator"] = instantiate  # found by its path, as Lightning imports it
    saved = {"state_dict": Module(3).state_dict(), "hyper_parameters": {"width": 3}}
    torch.save({**saved, "pytorch-lightning_version": pl.__version__}, tmp_path / "m.ckpt")
    path = f"{__name__}._compat_instantiator"
    assert instantiator_allowed("lightning.pytorch.cli.instantiate_module") and not instantiator_allowed(path)
    with pytest.raises(ValueError, match="allowlist"):
        Module.load_from_checkpoint(tmp_path / "m.ckpt", **{INSTANTIATOR_KEY: path})
    allow_instantiator(path)
    assert instantiator_allowed(path) and not instantiator_allowed(["not", "a", "path"])
    assert Module.load_from_checkpoint(tmp_path / "m.ckpt", **{INSTANTIATOR_KEY: path}).layer.in_features == 3
    assert built == [{"width": 3}]


# ---------------------------------------------------------------------------------------------------
# TensorBoard (torch.utils.tensorboard)


def test_tensorboard__event_file_writer_writes_into_the_writers_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    from mae.compat.tensorboard import event_file_writer

    writer = SummaryWriter(str(tmp_path))
    file_writer = event_file_writer(writer)
    assert event_file_writer(writer) is file_writer and file_writer.get_logdir() == str(tmp_path)
    writer.add_scalar("loss", 1.0, 0)
    for summary in hparams({"lr": 0.1}, {}):
        file_writer.add_summary(summary)
    writer.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # beside the scalars, no folder of its own
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")


def test_lightning__refresh_last_checkpoint_writes_last_as_save_last_does(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mae.compat.lightning import (
        checkpoint_period_epochs,
        checkpoints_at_train_epoch_end,
        refresh_last_checkpoint,
    )
    from tests.helpers import RandomImages, make_trainer, pretrain_module

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)  # no top-k: no last either
    seen = {}

    class RefreshAfterFirstStep(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen["at_epoch_end"] = checkpoints_at_train_epoch_end(checkpoint, trainer)  # no validation
            if trainer.global_step == 1:
                refresh_last_checkpoint(checkpoint, trainer)

    assert (
        checkpoint_period_epochs(checkpoint) == 1
        and checkpoint_period_epochs(ModelCheckpoint(every_n_epochs=3)) == 3
    )
    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        limit_val_batches=0,
        callbacks=[checkpoint, RefreshAfterFirstStep()],
        enable_checkpointing=True,
    )
    trainer.fit(pretrain_module(optim={"warmup_epochs": 0}), datamodule=RandomImages(n=8, batch_size=4))
    assert seen["at_epoch_end"]
    # written at step 1; Lightning's own end-of-training save_last then sees a last.ckpt and leaves it
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 1


def test_lightning__rng_states_restored_draw_the_same_numbers():
    import random

    import numpy as np

    from mae.compat.lightning import restore_rng_states, rng_states

    states = rng_states(include_cuda=False)
    first = (torch.rand(3), np.random.rand(), random.random())
    restore_rng_states(states)
    again = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def test_lightning__is_logging_step_follows_log_every_n_steps(tmp_path):
    import lightning.pytorch as pl

    from mae.compat.lightning import is_logging_step, set_scratch_root
    from tests.helpers import RandomImages, make_trainer, pretrain_module

    logged = []

    class Record(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            logged.append(is_logging_step(trainer))

    trainer = make_trainer(
        tmp_path, max_steps=4, limit_val_batches=0, log_every_n_steps=2, callbacks=[Record()]
    )
    set_scratch_root(trainer, str(tmp_path / "scratch"))
    assert trainer.default_root_dir == str(tmp_path / "scratch")
    trainer.fit(pretrain_module(optim={"warmup_epochs": 0}), datamodule=RandomImages(n=16, batch_size=4))
    assert logged == [False, True, False, True]  # steps 1 and 3 (0-based) end the 2-step periods


def test_lightning__builds_trainer_is_the_frame_lightningcli_builds_the_trainer_in():
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from mae.compat.lightning import builds_trainer

    with pytest.raises(MisconfigurationException) as raised:
        LightningCLI(BoringModel, BoringDataModule, run=False, args=["--trainer.max_epochs=-5"])
    frames, tb = [], raised.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    assert [frame.f_code.co_name for frame in frames if builds_trainer(frame)] == ["_instantiate_trainer"]
    assert not builds_trainer(inspect.currentframe())
