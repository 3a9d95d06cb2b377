"""timm hub folders (``mae.convert.formats.timm_folder``): written with timm's ``save_for_hf``, recognised by
their ``config.json``, read back with the normalisation ``pretrained_cfg`` records."""

import dataclasses

import pytest
import timm
import torch

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import timm_folder
from mae.convert.formats.base import CheckpointPath
from mae.errors import ConfigError
from tests.unit.convert.formats.conftest import same_outputs

DATA_CONFIG = {
    "input_size": (3, 32, 32),
    "mean": (0.1, 0.2, 0.3),
    "std": (0.4, 0.5, 0.6),
    "interpolation": "bicubic",
    "crop_pct": 0.875,
    "crop_mode": "center",
}


def _checkpoint(model) -> MAECheckpoint:
    return MAECheckpoint("tiny", "lightning", model.state_dict(), model.config)


def test_write_then_read__timm_builds_it_and_the_reader_gets_weights_and_normalisation(tiny_mae, tmp_path):
    folder = tmp_path / "timm"
    folder.mkdir()
    timm_folder.write(_checkpoint(tiny_mae), folder, DATA_CONFIG, "cc-by-4.0")
    assert timm_folder.detect(CheckpointPath(folder)) and not timm_folder.detect(CheckpointPath(tmp_path))
    ckpt = timm_folder.read(CheckpointPath(folder))
    assert ckpt.format == "timm" and ckpt.data == {
        "in_chans": 3,
        "img_size": [32, 32],
        "mean": [0.1, 0.2, 0.3],
        "std": [0.4, 0.5, 0.6],
    }
    assert ckpt.state_dict.keys() == _checkpoint(tiny_mae).encoder_state_dict().keys()
    assert same_outputs(timm.create_model(f"local-dir:{folder}", pretrained=True).eval(), tiny_mae)


def test_write__an_eps_timm_does_not_use_is_refused(tiny_mae, tmp_path):
    ckpt = _checkpoint(tiny_mae)
    ckpt = dataclasses.replace(ckpt, config={**ckpt.config, "layer_norm_eps": 1e-12})
    with pytest.raises(ConfigError, match="LayerNorm eps 1e-12; a timm ViT uses 1e-6"):
        timm_folder.write(ckpt, tmp_path, DATA_CONFIG, None)
    assert not list(tmp_path.iterdir())


def test_detect__a_config_json_without_timm_keys_is_not_timms(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "vit_mae"}')
    torch.save({}, tmp_path / "pytorch_model.bin")
    assert not timm_folder.detect(CheckpointPath(tmp_path))
