"""``mae reconstruct``: your own images through a pretrained MAE, as a captioned figure."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae import create_model
from mae.apps.reconstruction_figure import reconstruction_figure
from mae.cli.main import invoke
from mae.convert.export import export_encoder
from mae.convert.huggingface import save_hf_pretrained
from mae.inference.images import load_image
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import mask_noise
from tests.helpers import TINY_KWARGS, run_mae, tiny_pretraining_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(tmp_path / "photo.jpg")
    Image.fromarray(rng.integers(0, 65536, (20, 20), dtype=np.uint16)).save(tmp_path / "scan16.png")
    (tmp_path / "more").mkdir()
    Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(tmp_path / "more" / "gray.png")
    return tmp_path


def test_reconstruct__figure_losses_and_determinism(checkpoint, images, capsys):
    args = [
        "--checkpoint",
        str(checkpoint),
        str(images / "photo.jpg"),
        str(images / "scan16.png"),
        str(images / "more"),
    ]
    first = invoke("reconstruct", [*args, "--out", str(images / "a.png"), "--seed", "3"])
    out = capsys.readouterr().out
    assert (
        "photo.jpg: masked-patch loss" in out
        and "gray.png: masked-patch loss" in out
        and "TRUE patches" in out
    )
    assert len(first.losses) == 3 and Image.open(images / "a.png").size == first.image.size
    invoke("reconstruct", [*args, "--out", str(images / "b.png"), "--seed", "3"])
    assert (images / "a.png").read_bytes() == (images / "b.png").read_bytes()  # same seed, same figure
    invoke("reconstruct", [*args, "--out", str(images / "c.png"), "--seed", "4"])
    assert (images / "a.png").read_bytes() != (images / "c.png").read_bytes()


def test_reconstruct__per_image_loss_is_the_training_loss_of_that_image(checkpoint, images):
    from mae import load_mae

    model, _ = load_mae(checkpoint)
    norm = Normalization.of(None, 3, "test")
    img = load_image(images / "photo.jpg", (16, 16), norm)[None]
    figure = reconstruction_figure(model, img, ["photo"], norm, 0.75, seed=5)
    noise = model.sample_noise(1, 0.75, "cpu", torch.Generator().manual_seed(5))
    loss, _, _ = model.eval()(img, 0.75, noise)
    assert figure.losses[0] == pytest.approx(loss.item(), rel=1e-5)


def test_reconstruct__seeded_masks_the_same_mask_and_the_raw_normalised_prediction(checkpoint, images):
    from mae import load_mae

    model, _ = load_mae(checkpoint)
    shared = mask_noise(model, 3, 0.75, seed=1, same_mask=True)
    assert torch.equal(shared[0], shared[1]) and torch.equal(shared[0], shared[2])
    own = mask_noise(model, 3, 0.75, seed=1, same_mask=False)
    assert not torch.equal(own[0], own[1]) and torch.equal(own, mask_noise(model, 3, 0.75, 1, False))
    norm = Normalization.of(None, 3, "test")
    imgs = torch.stack([load_image(images / n, (16, 16), norm) for n in ("photo.jpg", "scan16.png")])
    raw = reconstruction_figure(model, imgs, ["a", "b"], norm, unnormalize="none")
    patch = reconstruction_figure(model, imgs, ["a", "b"], norm, unnormalize="patch")
    assert "raw prediction" in raw.caption and "TRUE patches" in patch.caption
    assert raw.losses == patch.losses and np.asarray(raw.image).tolist() != np.asarray(patch.image).tolist()


def test_reconstruct__official_and_hugging_face_files_and_another_input_size(tmp_path, images):
    model = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS)
    torch.save({"model": model.state_dict()}, tmp_path / "mae_visualize_tiny.pth")
    save_hf_pretrained(model, tmp_path / "hf")
    for source in (tmp_path / "mae_visualize_tiny.pth", tmp_path / "hf"):
        small = invoke(
            "reconstruct",
            ["--checkpoint", str(source), str(images / "photo.jpg"), "--out", str(tmp_path / "s.png")],
        )
    large = invoke(
        "reconstruct",
        [
            "--checkpoint",
            str(tmp_path / "hf"),
            str(images / "photo.jpg"),
            "--img-size",
            "32",
            "--out",
            str(tmp_path / "l.png"),
        ],
    )
    assert small.image.size[0] >= 4 * 160 and large.image.size[0] >= 4 * 160  # panels enlarged to >= 160 px
    assert "Pixel-target model" in small.caption  # the official visualisation models regress raw pixels


def test_reconstruct__encoder_only_checkpoint_says_what_has_a_decoder(tmp_path, checkpoint, images):
    export_encoder(checkpoint, tmp_path / "encoder.safetensors")
    result = run_mae(
        "reconstruct",
        "--checkpoint",
        str(tmp_path / "encoder.safetensors"),
        str(images / "photo.jpg"),
        "--out",
        str(tmp_path / "x.png"),
        timeout=120,
        check=False,
    )
    assert result.returncode != 0 and "reconstruction needs the full MAE" in result.stderr
    assert "mae_visualize_vit" in result.stderr and not (tmp_path / "x.png").exists()


def test_reconstruct__unreadable_and_huge_images_named_and_skipped(tmp_path, checkpoint, images, capsys):
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    Image.new("L", (120, 90)).save(tmp_path / "huge.png")  # over the limit given below
    figure = invoke(
        "reconstruct",
        [
            "--checkpoint",
            str(checkpoint),
            str(tmp_path / "broken.jpg"),
            str(tmp_path / "huge.png"),
            str(images / "photo.jpg"),
            "--out",
            str(tmp_path / "x.png"),
            "--max-image-pixels",
            "10000",
        ],
    )
    err = capsys.readouterr().err
    assert "skipped" in err and "broken.jpg" in err and "huge.png" in err and "max_image_pixels" in err
    assert len(figure.losses) == 1
    with pytest.raises(ValueError, match=r"no readable image among \S*broken\.jpg \(each skipped one"):
        invoke(
            "reconstruct",
            ["--checkpoint", str(checkpoint), str(tmp_path / "broken.jpg"), "--out", str(tmp_path / "y.png")],
        )  # a project error: the command ends with "error: ..." and status 2
