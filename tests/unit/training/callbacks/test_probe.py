"""The linear-probe monitor: its encoder blocks (``probe.feature_blocks``), checked when the run starts and
read at every probe."""

from types import SimpleNamespace

import pytest

import mae.eval.probe as probe
from mae.cli.main import invoke
from mae.data import ImageFolderDataModule
from mae.errors import ConfigError
from mae.training.callbacks.probe import ProbeCallback
from tests.helpers import tiny_mae, tiny_pretrain_config, write_config, write_image_folder


def test_probe_monitor__a_feature_block_the_encoder_lacks_fails_when_the_run_starts():
    model = tiny_mae()  # 2 blocks
    module = SimpleNamespace(encoder=model, network=model)
    trainer = SimpleNamespace(datamodule=None)
    ProbeCallback(every_n_epochs=1, feature_blocks=[0, -1]).on_fit_start(trainer, module)
    with pytest.raises(
        ConfigError, match=r"probe.feature_blocks -3 is not a block of this encoder of depth 2"
    ):
        ProbeCallback(every_n_epochs=1, feature_blocks=[-3]).on_fit_start(trainer, module)
    ProbeCallback(every_n_epochs=0, feature_blocks=[5]).on_fit_start(trainer, module)  # off: not checked


def test_probe_monitor__reads_the_chosen_blocks_concatenated(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "train", ["a", "b"], per_class=6, size=(32, 32))
    write_image_folder(tmp_path / "val", ["a", "b"], per_class=2, size=(32, 32), seed=1)
    data = ImageFolderDataModule(str(tmp_path), img_size=32, batch_size=6, num_workers=0)
    data.setup("fit")
    widths = []
    extract = probe.extract_splits

    def spy(encode, *args, **kwargs):
        train, val = extract(encode, *args, **kwargs)
        widths.append(train.feats.shape[1])
        return train, val

    monkeypatch.setattr(probe, "extract_splits", spy)
    monitor = ProbeCallback(every_n_epochs=1, feature_blocks=[0, 1], max_epochs=2)
    trainer = SimpleNamespace(is_global_zero=True, progress_bar_callback=None)
    metrics = monitor.measure(tiny_mae().eval(), data, trainer, "cpu")
    assert widths == [2 * 64] and 0 <= metrics["val/probe_acc1"] <= 100  # two blocks' cls tokens


def test_probe_monitor__a_bad_block_in_a_pretraining_config_stops_it_before_the_first_step(tmp_path):
    write_image_folder(tmp_path / "data" / "train", ["a", "b"], per_class=4, size=(16, 16))
    write_image_folder(tmp_path / "data" / "val", ["a", "b"], per_class=2, size=(16, 16), seed=1)
    config = tiny_pretrain_config(tmp_path, "blocks", probe={"every_n_epochs": 1, "feature_blocks": [0, 1]})
    with pytest.raises(ValueError, match=r"probe.feature_blocks 1 is not a block of this encoder of depth 1"):
        invoke("pretrain", ["--config", str(write_config(tmp_path, config, "blocks"))])
    assert not list(tmp_path.glob("runs/blocks/*/checkpoints/*.ckpt"))
