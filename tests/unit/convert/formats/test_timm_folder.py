"""timm hub folders (``mae.convert.formats.timm_folder``): written with timm's ``save_for_hf``, recognised by
their ``config.json``, read back with the normalisation ``pretrained_cfg`` records."""

import dataclasses

import pytest
import timm
import torch

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import timm_folder
from mae.convert.formats.base import CheckpointPath
from mae.errors import ConfigError, InputError
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


def test_read__a_timm_folder_of_a_cnn_is_the_cnn_family_and_loads_as_that_timm_model(tmp_path):
    from timm.models import save_for_hf

    from mae import load_backbone
    from mae.convert.sources import read_checkpoint

    torch.manual_seed(0)
    model = timm.create_model("convnextv2_atto", num_classes=0, in_chans=1).eval()
    data_config = {"input_size": (1, 32, 32), "mean": (0.5,), "std": (0.25,)}
    save_for_hf(model, str(tmp_path), {}, {"num_classes": 0, "in_chans": 1}, data_config=data_config)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.family == "cnn" and ckpt.config["encoder"] == "convnextv2_atto" and not ckpt.has_decoder
    assert ckpt.config["in_chans"] == 1 and ckpt.data["mean"] == [0.5]
    backbone = load_backbone(tmp_path).eval()  # strict: every tensor, head norm included
    assert type(backbone) is type(model) and not backbone.load_report.missing
    imgs = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(backbone.forward_features(imgs), model.forward_features(imgs))


def test_read__a_timm_folder_naming_no_timm_model_is_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    save_file({"stem.weight": torch.zeros(2, 3, 1, 1)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"architecture": "resnet_of_nobody", "pretrained_cfg": {}}')
    with pytest.raises(
        InputError, match=r"names architecture 'resnet_of_nobody', which timm .* does not know"
    ):
        timm_folder.read(CheckpointPath(tmp_path))
