"""The model family table (``mae.convert.families``): a checkpoint's family from its record, its encoder
part in timm's names, the rows every reader and export consults."""

import timm
import torch

from mae.convert.architecture import CNN_CLASSIFIER_CLASS, CNN_MAE_CLASS, MAE_CLASS, VIT_CLASS
from mae.convert.families import FAMILY_OF_CLASS, MODEL_FAMILIES, family_of
from mae.convert.sources import read_checkpoint
from tests.helpers import tiny_mae, untrained_cnn_checkpoint


def test_family_of_class__every_record_class_has_a_row():
    expected = {MAE_CLASS: "vit", VIT_CLASS: "vit", CNN_MAE_CLASS: "cnn", CNN_CLASSIFIER_CLASS: "cnn"}
    assert FAMILY_OF_CLASS == expected
    assert set(FAMILY_OF_CLASS.values()) == set(MODEL_FAMILIES)


def test_family_of__a_config_names_its_family_and_old_configs_are_vits():
    assert family_of(tiny_mae().config) == "vit"
    assert family_of({"family": "cnn", "encoder": "resnet10t"}) == "cnn"
    assert family_of({"encoder": "resnet10t", "num_classes": 3}) == "cnn"  # a CNN classifier's record


def test_cnn_checkpoint__read_as_the_cnn_family_its_encoder_exactly_timms_state_dict(tmp_path):
    ckpt = read_checkpoint(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"))
    assert ckpt.family == "cnn" and ckpt.model_family is MODEL_FAMILIES["cnn"] and ckpt.has_decoder
    timm_state = timm.create_model("resnet10t", num_classes=0).state_dict()
    encoder = ckpt.encoder_state_dict()
    assert {k: v.shape for k, v in encoder.items()} == {k: v.shape for k, v in timm_state.items()}
    assert all(torch.equal(encoder[k], ckpt.state_dict[f"encoder.{k}"]) for k in encoder)
    without_decoder = {k: v for k, v in ckpt.state_dict.items() if k.startswith("encoder.")}
    assert not MODEL_FAMILIES["cnn"].has_decoder(without_decoder)


def test_cnn_row__timm_name_and_feature_arguments_and_refused_targets():
    row = MODEL_FAMILIES["cnn"]
    config = {
        "family": "cnn",
        "encoder": "convnextv2_atto",
        "in_chans": 1,
        "encoder_kwargs": {"drop_path_rate": 0.1},
    }
    assert row.timm_architecture(config) == "convnextv2_atto"
    assert row.timm_model_args(config) == {"drop_path_rate": 0.1, "num_classes": 0, "in_chans": 1}
    assert "huggingface" in row.refuses and not MODEL_FAMILIES["vit"].refuses
