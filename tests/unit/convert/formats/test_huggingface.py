"""Hugging Face ViTMAE / ViT weights (``mae.convert.formats.huggingface``): a folder or a weights file with
its ``config.json``, read into our names; the folder ``write`` makes loads in transformers and back here
with the same outputs; models that do not compute as an MAE ViT are refused."""

import json

import pytest
import torch

from mae import load_mae
from mae.convert.formats import huggingface
from mae.convert.formats.base import CheckpointPath
from mae.convert.huggingface import save_hf_pretrained, to_hf_state_dict
from mae.convert.sources import read_checkpoint
from mae.errors import InputError, MissingFileError
from tests.unit.convert.formats.conftest import same_outputs


def test_folder__detected_read_and_loaded_strictly_with_the_same_outputs(tiny_mae, tmp_path):
    save_hf_pretrained(tiny_mae, tmp_path / "hf")
    assert huggingface.detect_folder(CheckpointPath(tmp_path / "hf"))
    ckpt = huggingface.read_folder(CheckpointPath(tmp_path / "hf"))
    assert ckpt.format == "huggingface" and ckpt.state_dict.keys() == tiny_mae.state_dict().keys()
    model, report = load_mae(tmp_path / "hf")
    assert not report.missing and not report.ignored and same_outputs(model.eval(), tiny_mae)


def test_file__a_state_dict_in_hugging_face_names_with_its_config_beside_it(tiny_mae, tmp_path):
    save_hf_pretrained(tiny_mae, tmp_path)
    torch.save(to_hf_state_dict(tiny_mae.state_dict()), tmp_path / "weights.bin")
    assert huggingface.detect_file(CheckpointPath(tmp_path / "weights.bin"))
    torch.save(tiny_mae.state_dict(), tmp_path / "ours.pth")  # timm names: not Hugging Face's
    assert not huggingface.detect_file(CheckpointPath(tmp_path / "ours.pth"))
    ckpt = huggingface.read_file(CheckpointPath(tmp_path / "weights.bin"))
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in tiny_mae.state_dict().items())
    (tmp_path / "config.json").unlink()
    with pytest.raises(MissingFileError, match="need their config.json beside them"):
        huggingface.read_file(CheckpointPath(tmp_path / "weights.bin"))


def test_read__another_activation_is_refused_naming_the_config(tiny_mae, tmp_path):
    save_hf_pretrained(tiny_mae, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_new"}))
    with pytest.raises(InputError, match="hidden_act is 'gelu_new'; MAE ViTs use exact GELU"):
        huggingface.read_folder(CheckpointPath(tmp_path))


def test_write__transformers_loads_the_folder_with_its_image_processor(tiny_mae, tmp_path):
    transformers = pytest.importorskip("transformers")
    huggingface.write(tiny_mae.state_dict(), tiny_mae.config, tmp_path, True, 0.75, [0.5] * 3, [0.25] * 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path).eval()
    assert hf.config.num_attention_heads == tiny_mae.config["num_heads"]
    assert list(transformers.ViTImageProcessor.from_pretrained(tmp_path).image_mean) == [0.5] * 3
    model, _ = load_mae(tmp_path)
    assert same_outputs(model.eval(), tiny_mae)


@pytest.mark.parametrize(
    "config, refusal",
    [
        ('{"model_type": "bert"}', "no checkpoint format recognises"),
        ("{", "no checkpoint format recognises"),
        ("[]", "no checkpoint format recognises"),
    ],
)
def test_folder__another_model_or_a_broken_config_json_is_refused_by_name(tmp_path, config, refusal):
    """A hub folder of another model, or with a config.json that is not a JSON object, is not read as a
    ViT MAE: refused naming the folder (it was a KeyError, JSONDecodeError or AttributeError traceback)."""
    from safetensors.torch import save_file

    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    save_file({"embeddings.word_embeddings.weight": torch.zeros(4, 8)}, str(folder / "model.safetensors"))
    for forced in ("auto", "huggingface"):
        with pytest.raises(InputError, match=refusal) as err:
            read_checkpoint(folder, format=forced)
        assert str(folder) in str(err.value)


def test_forced_huggingface_on_a_timm_folder__refused_not_a_traceback(tmp_path):
    """A timm folder (its config.json names no model_type) forced through the Hugging Face reader is refused
    by name (it was a KeyError traceback on its tensor names)."""
    from safetensors.torch import save_file

    folder = tmp_path / "timm"
    folder.mkdir()
    (folder / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", "num_classes": 0}')
    save_file({"blocks.0.attn.proj.bias": torch.zeros(4)}, str(folder / "model.safetensors"))
    with pytest.raises(InputError, match="no checkpoint format recognises"):
        read_checkpoint(folder, format="huggingface")
