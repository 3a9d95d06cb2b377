"""``mae reconstruct``'s job (``mae.apps.reconstruction_job``): the figure of the readable images written,
each unreadable one named and skipped, and the checks that come before the model is loaded."""

import pytest

from mae.apps.reconstruction_job import ReconstructionSettings, reconstruct_files
from mae.errors import ConfigError, UsageError
from mae.io.outputs import png_is_from
from tests.helpers import tiny_pretraining_checkpoint, write_image_folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


def test_reconstruct_files__draws_the_readable_images_and_names_the_others(checkpoint, tmp_path, capsys):
    root = write_image_folder(tmp_path / "root", ["a"], per_class=2, size=(20, 16))
    (root / "a" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "figure.png"
    figure = reconstruct_files(ReconstructionSettings([str(root)], checkpoint, out, mask_ratio=0.5, seed=3))
    assert len(figure.losses) == 2 and png_is_from("mae.reconstruct")(out)
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "broken.png" in captured.err
    assert captured.out.count("masked-patch loss") == 2 and captured.out.endswith(f"wrote {out}\n")


def test_reconstruct_files__a_mask_ratio_of_0_and_no_readable_image_are_refused(checkpoint, tmp_path):
    with pytest.raises(UsageError, match=r"0 hides nothing"):
        reconstruct_files(ReconstructionSettings(["x.png"], "no-such.ckpt", mask_ratio=0.0))
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match="no readable image among"):
        reconstruct_files(ReconstructionSettings([str(tmp_path / "bad.png")], checkpoint, tmp_path / "f.png"))
    assert not (tmp_path / "f.png").exists()


def test_reconstruct__a_hog_model_is_refused_by_name_saying_why(tmp_path, capsys, monkeypatch):
    from mae.cli.main import main

    monkeypatch.setattr("sys.argv", ["mae"])
    hog = tiny_pretraining_checkpoint(tmp_path / "hog", steps=1, target="hog")
    root = write_image_folder(tmp_path / "root", ["a"], per_class=1, size=(20, 16))
    out = tmp_path / "figure.png"
    with pytest.raises(SystemExit) as stop:
        main(["reconstruct", "--checkpoint", str(hog), str(root), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith(
        f"error: {hog} was pretrained with model.target hog: its decoder predicts the HOG features "
        "(MaskFeat's histograms of oriented gradients) of each masked patch, not pixels, so there is no "
        "reconstruction to draw"
    )
    assert not out.exists()
