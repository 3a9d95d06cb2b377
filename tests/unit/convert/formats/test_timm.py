"""Plain timm ``VisionTransformer`` state dicts (``mae.convert.formats.timm``): any dict of tensors, the last
row of the table; a state dict of another network is refused by name."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from mae import load_backbone
from mae.convert.formats import timm as timm_format
from mae.convert.formats.base import CheckpointPath
from mae.errors import InputError
from tests.unit.convert.formats.conftest import same_outputs


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_read__a_timm_vit_loads_strictly_with_the_same_outputs(tmp_path, suffix):
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_small_patch16_224", pretrained=False, num_classes=0, depth=2, img_size=64
    ).eval()
    path = tmp_path / f"vit_small_patch16_224.mae{suffix}"
    state = {k: v.contiguous() for k, v in vit.state_dict().items()}
    torch.save(state, path) if suffix == ".pth" else save_file(state, str(path))
    assert timm_format.detect(CheckpointPath(path))
    ckpt = timm_format.read(CheckpointPath(path))
    assert ckpt.format == "timm" and ckpt.state_dict.keys() == state.keys()
    model = load_backbone(path).eval()
    assert model.load_report.format == "timm" and model.blocks[0].attn.num_heads == 6  # assumed from 384 wide
    assert same_outputs(model, vit, size=64)


def test_detect__only_a_dict_of_tensors(tmp_path):
    torch.save({"model": {"x": torch.zeros(1)}, "epoch": 3}, tmp_path / "official.pth")
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    assert not timm_format.detect(CheckpointPath(tmp_path / "official.pth"))
    assert not timm_format.detect(CheckpointPath(tmp_path / "list.pth"))


def test_read__another_network_is_not_a_vit(tmp_path):
    torch.save(
        {"conv1.weight": torch.zeros(64, 3, 7, 7), "fc.weight": torch.zeros(10, 512)}, tmp_path / "r.pth"
    )
    with pytest.raises(InputError, match="r.pth is not a ViT / MAE state dict"):
        timm_format.read(CheckpointPath(tmp_path / "r.pth"))
