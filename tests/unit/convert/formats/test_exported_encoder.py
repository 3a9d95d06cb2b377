"""Our exported encoders (``mae.convert.formats.exported_encoder``): ``OUT.safetensors`` and its ``OUT.json``
record, written once, read back with the recorded heads (nothing assumed) and the same outputs."""

import dataclasses
import json

import pytest
import timm

from mae import load_backbone
from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import exported_encoder
from mae.convert.formats import timm as timm_format
from mae.convert.formats.base import CheckpointPath
from mae.errors import ConfigError
from tests.unit.convert.formats.conftest import same_outputs


def test_write_then_read__the_record_gives_the_architecture_and_timm_alone_builds_it(tiny_mae, tmp_path):
    ckpt = MAECheckpoint("tiny.ckpt", "lightning", tiny_mae.state_dict(), tiny_mae.config)
    weights, sidecar = exported_encoder.write(ckpt, tmp_path / "enc.safetensors")
    record = json.loads(sidecar.read_text())
    assert record["source"] == "tiny.ckpt" and record["model_args"]["num_classes"] == 0
    assert exported_encoder.is_exported_encoder(weights) and exported_encoder.detect(CheckpointPath(weights))
    read = exported_encoder.read(CheckpointPath(weights))
    assert read.notes == [] and read.config["num_heads"] == tiny_mae.config["num_heads"]
    assert same_outputs(load_backbone(weights).eval(), tiny_mae)
    vit = timm.create_model(
        record["architecture"],
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(weights)),
        **record["model_args"],
    )
    assert same_outputs(vit.eval(), tiny_mae)


def test_detect__weights_without_the_record_are_a_plain_timm_file(tiny_mae, tmp_path):
    ckpt = MAECheckpoint("tiny.ckpt", "lightning", tiny_mae.state_dict(), tiny_mae.config)
    weights, sidecar = exported_encoder.write(ckpt, tmp_path / "enc.safetensors")
    sidecar.write_text(json.dumps({"model_args": {}}))  # not our record
    assert not exported_encoder.detect(CheckpointPath(weights)) and timm_format.detect(
        CheckpointPath(weights)
    )


def test_write__refuses_another_suffix_and_an_eps_timm_does_not_use(tiny_mae, tmp_path):
    ckpt = MAECheckpoint("tiny.ckpt", "lightning", tiny_mae.state_dict(), tiny_mae.config)
    with pytest.raises(ConfigError, match="must end in .safetensors"):
        exported_encoder.write(ckpt, tmp_path / "enc.pth")
    odd = dataclasses.replace(ckpt, config={**ckpt.config, "layer_norm_eps": 1e-5})
    with pytest.raises(ConfigError, match="LayerNorm eps 1e-05"):
        exported_encoder.write(odd, tmp_path / "enc.safetensors")
    assert not list(tmp_path.iterdir())


def test_write_then_read__a_cnn_encoder_is_timms_state_dict_and_its_record_the_cnn_config(tmp_path):
    import torch
    from safetensors.torch import load_file

    from mae.convert.sources import read_checkpoint
    from tests.helpers import untrained_cnn_checkpoint

    ckpt = read_checkpoint(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"))
    weights, sidecar = exported_encoder.write(ckpt, tmp_path / "enc.safetensors")
    record = json.loads(sidecar.read_text())
    assert record["architecture"] == "resnet10t" and record["model_args"] == {"num_classes": 0, "in_chans": 3}
    timm.create_model("resnet10t", num_classes=0).load_state_dict(load_file(weights), strict=True)
    read = exported_encoder.read(CheckpointPath(weights))
    assert read.family == "cnn" and read.config == ckpt.config and not read.has_decoder
    assert all(torch.equal(v, ckpt.state_dict[k]) for k, v in read.state_dict.items())
