"""Commands given values that would compute nonsense or exhaust memory: checkpoint architecture
records that disagree with their tensors, reconstruct's numeric options, and a probe that could not
choose or train its head."""

from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from mae.cli.command import USAGE_ERROR_EXIT_CODE, run_command
from mae.cli.main import invoke
from mae.convert.architecture import ARCHITECTURE_KEY
from mae.convert.backbone import load_backbone, load_mae
from tests.helpers import tiny_pretraining_checkpoint, write_image_folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("inputs"))


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return path


def _edited(checkpoint, tmp_path, **args):
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    ckpt[ARCHITECTURE_KEY]["args"].update(args)
    path = tmp_path / "edited.ckpt"
    torch.save(ckpt, path)
    return path


# ---------------------------------------------------------------- architecture records


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"embed_dim": 2**20}, r"record says embed_dim=1048576, but its tensors have embed_dim=32"),
        ({"depth": 4000}, r"record says depth=4000, but its tensors have depth=1"),
        ({"decoder_embed_dim": 2**20}, r"record says decoder_embed_dim=1048576"),
        (
            {"img_size": [4096, 4096]},
            r"record says img_size=\(4096, 4096\), but pos_embed holds 16 patch positions",
        ),
        ({"num_heads": 5}, r"record has num_heads=5, which does not divide embed_dim=32"),
        ({"embed_dim": "wide"}, r"record has embed_dim='wide'; expected a positive integer"),
        (
            {"attention_kind": "flash"},
            r"record has arguments MaskedAutoencoderViT does not take: \['attention_kind'\]",
        ),
    ],
)
def test_record__checked_against_the_tensors_before_anything_is_built(checkpoint, tmp_path, args, expected):
    path = _edited(checkpoint, tmp_path, **args)
    for load in (load_mae, load_backbone):
        with pytest.raises(ValueError, match=rf"edited\.ckpt: its mae_architecture {expected}"):
            load(path)


def test_record__reconstruct_refuses_a_huge_record_by_name(checkpoint, tmp_path, image, capsys):
    path = _edited(checkpoint, tmp_path, embed_dim=2**20)
    with pytest.raises(SystemExit) as exit_info:
        argv = ["--checkpoint", str(path), str(image), "--out", str(tmp_path / "f.png")]
        run_command(partial(invoke, "reconstruct", argv))
    assert exit_info.value.code == USAGE_ERROR_EXIT_CODE
    assert "edited.ckpt: its mae_architecture record says embed_dim=1048576" in capsys.readouterr().err


def test_record__a_faithful_record_still_loads(checkpoint):
    model, _ = load_mae(checkpoint)
    assert model.config["embed_dim"] == 32 and load_backbone(checkpoint).embed_dim == 32


# ---------------------------------------------------------------- mae reconstruct options


@pytest.mark.parametrize(
    "option, expected",
    [
        (["--mask-ratio", "nan"], "--mask-ratio must be in (0, 1)"),
        (["--mask-ratio", "inf"], "--mask-ratio must be in (0, 1)"),
        (["--mask-ratio", "0"], "0 hides nothing: there is nothing to reconstruct"),
        (["--img-size", "-8"], "argument --img-size: must be at least 1, got -8"),
        (["--mean", "0.5", "0.5", "0.5", "--std", "0", "0", "0"], "positive, finite standard deviations"),
        (["--mean", "nan", "0.5", "0.5", "--std", "1", "1", "1"], "finite means"),
    ],
)
def test_reconstruct__options_that_would_draw_nonsense_are_refused(
    checkpoint, tmp_path, image, option, expected, capsys
):
    out = tmp_path / "figure.png"
    argv = ["--checkpoint", str(checkpoint), str(image), "--out", str(out), *option]
    with pytest.raises(SystemExit) as exit_info:
        run_command(partial(invoke, "reconstruct", argv))
    assert exit_info.value.code == USAGE_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert not out.exists()  # no figure of NaN losses


# ---------------------------------------------------------------- mae probe


@pytest.fixture(scope="module")
def probe_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe_data")
    write_image_folder(root / "few" / "train", ["a", "b", "c"], per_class=1, size=(20, 20))
    write_image_folder(root / "few" / "val", ["a", "b", "c"], per_class=1, size=(20, 20), seed=1)
    return root


def _probe(checkpoint, root, *extra):
    data = [
        "--data.class_path",
        "mae.data.ImageFolderDataModule",
        "--data.root",
        str(root),
        "--data.img_size",
        "16",
        "--data.num_workers",
        "0",
        "--data.batch_size",
        "2",
    ]
    return invoke("probe", ["--checkpoint", str(checkpoint), *data, *extra])


def test_probe__one_training_image_per_class_leaves_nothing_to_choose_the_head_on(checkpoint, probe_data):
    with pytest.raises(ValueError, match=r"3 training images \(1.0 per class\) leave none to hold out"):
        _probe(checkpoint, probe_data / "few")


def test_probe__zero_epochs_is_refused_before_any_feature_is_extracted(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit):  # by the parser (mae.cli.command_options.positive_int)
        _probe(checkpoint, tmp_path / "never_read", "--max-epochs", "0")
    assert "error: argument --max-epochs: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("std", [[0.0], [float("nan")], [float("inf")]])
def test_data_statistics__a_zero_or_non_finite_std_is_refused_naming_the_keys(std):
    """The training side of the same rule (``check_statistics``): NaN passed ``min(std) <= 0``."""
    from mae.data import DigitsDataModule

    with pytest.raises(ValueError, match=r"data.mean / data.std need finite means and positive, finite"):
        DigitsDataModule(in_chans=1, mean=[0.5], std=std)
    with pytest.raises(ValueError, match=r"finite means"):
        DigitsDataModule(in_chans=1, mean=[float("nan")], std=[0.3])


# ---------------------------------------------------------------- shared options, checked by the parser


@pytest.mark.parametrize(
    "command, option, expected",
    [
        ("export", ["--mean", "0.5"], "give --mean and --std together"),
        ("export", ["--img-size", "0"], "argument --img-size: must be at least 1, got 0"),
        ("anomaly", ["--img-size", "-2"], "argument --img-size: must be at least 1, got -2"),
        ("anomaly", ["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        ("anomaly", ["--mean", "0.5", "--std", "1", "1"], "--mean and --std need the same number of values"),
    ],
)
def test_shared_options__values_the_work_cannot_use_are_refused_before_anything_is_read(
    tmp_path, command, option, expected, capsys
):
    never_read = ["--checkpoint", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "out.onnx")]
    argv = [*never_read, *(["--test", str(tmp_path)] if command == "anomaly" else []), *option]
    with pytest.raises(SystemExit) as exit_info:
        run_command(partial(invoke, command, argv))
    assert exit_info.value.code == USAGE_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
