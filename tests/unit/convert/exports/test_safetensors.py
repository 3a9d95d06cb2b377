"""The safetensors target (``mae.convert.exports.safetensors``): the exported encoder's two files, what it
tells the user, and the outputs it claims."""

import json

import torch

from mae.convert.architecture import mae_record
from mae.convert.exports import safetensors
from mae.convert.exports.base import ExportRequest
from mae.models import MaskedAutoencoderViT


def test_export__two_files_and_a_line_that_loads_them_with_timm_alone(tmp_path):
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(
        img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, decoder_depth=1
    )
    state = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}
    torch.save(
        {**state, "pytorch-lightning_version": "2.6.6", "mae_architecture": mae_record(model.config)},
        tmp_path / "c.ckpt",
    )
    out = tmp_path / "enc.safetensors"
    assert [o.path for o in safetensors.TARGET.outputs(out)] == [out, tmp_path / "enc.json"]
    export = safetensors.TARGET.export(ExportRequest(str(tmp_path / "c.ckpt"), out, num_heads=4))
    assert json.loads(export.sidecar.read_text())["model_args"]["num_heads"] == 4
    lines = safetensors.TARGET.describe(export)
    assert lines[0] == f"wrote {out} and {tmp_path / 'enc.json'}"
    assert lines[1].startswith(
        f'load with timm alone: timm.create_model("{export.architecture}", pretrained=True'
    )
    assert all(o.ours(o.path) for o in safetensors.TARGET.outputs(out))


def test_export__a_cnn_encoder_loads_strictly_into_timms_model_of_its_name(tmp_path):
    import pytest
    import timm
    from safetensors.torch import load_file

    from mae.errors import ConfigError
    from tests.helpers import untrained_cnn_checkpoint

    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt")
    export = safetensors.export(ExportRequest(str(checkpoint), tmp_path / "enc.safetensors"))
    assert export.architecture == "resnet10t"
    timm.create_model("resnet10t", num_classes=0).load_state_dict(load_file(export.weights), strict=True)
    assert 'timm.create_model("resnet10t", pretrained=True' in "\n".join(safetensors.describe(export))
    with pytest.raises(ConfigError, match="--num-heads is a ViT's; .* holds the CNN resnet10t"):
        safetensors.export(ExportRequest(str(checkpoint), tmp_path / "heads.safetensors", num_heads=4))
