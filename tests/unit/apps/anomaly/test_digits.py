"""The built-in digit anomaly task (``mae.apps.anomaly.digits``): deterministic, in the MVTec AD layout,
its ground truth the pixels each defect changed."""

import numpy as np
import pytest
from PIL import Image

from mae.apps.anomaly.digits import CHANGED, DEFECTS, write_digit_anomalies
from mae.apps.anomaly.layout import read_test_set


def test_digit_anomalies__deterministic_mvtec_layout_with_changed_pixels_as_ground_truth(tmp_path):
    import torchvision.transforms as T

    from mae.data.sources.builtin import DigitsDataset

    first = write_digit_anomalies(tmp_path / "a", seed=3, num_normal=4, num_test=8)
    again = write_digit_anomalies(tmp_path / "b", seed=3, num_normal=4, num_test=8)
    other = write_digit_anomalies(tmp_path / "c", seed=4, num_normal=4, num_test=8)

    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}

    assert files(first) == files(again) and files(first) != files(other)
    assert write_digit_anomalies(first, seed=3, num_normal=4, num_test=8) == first  # reused as it is
    with pytest.raises(ValueError, match="other parameters"):
        write_digit_anomalies(first, seed=5, num_normal=4, num_test=8)
    test_set = read_test_set(first / "test")
    assert test_set.has_masks and set(test_set.kinds) == {"good", *DEFECTS}
    assert sorted(p.name for p in (first / "train" / "good").iterdir()) == [
        "0001.png",
        "0002.png",
        "0003.png",
        "0004.png",
    ]
    # the clean digit as the digits data module's evaluation view serves it, independently
    val, resize = DigitsDataset("val"), T.Resize(32, interpolation=T.InterpolationMode.BICUBIC)
    for image in test_set.images:
        clean = np.asarray(resize(val[int(image.path.stem) // 5][0]))[..., 0].astype(int)
        seen = np.asarray(Image.open(image.path)).astype(int)
        if image.kind == "good":
            assert (seen == clean).all()
        else:
            truth = np.asarray(Image.open(image.mask)) > 0
            assert (truth == (np.abs(seen - clean) > CHANGED * 255)).all() and truth.sum() >= 6
