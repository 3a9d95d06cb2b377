"""The shard converter's parts (``mae.data.tools.shard``), in this process: one sample per readable file
(decoded as the data module will decode it), the pixel kinds the workers note, the listing, and what the
data module needs to know about the pixels. The conversion itself, with its worker processes:
tests/integration/streaming."""

import numpy as np
import pytest
from PIL import Image

from mae.data.decoding.formats import EncodedImage
from mae.data.tools.shard import describe_pixels, encode_sample, list_split, note_kind, noted_kinds
from tests.helpers import write_image_folder


def test_encode_sample__the_file_s_bytes_once_they_decode_else_nothing_and_its_name(tmp_path, capfd):
    root = write_image_folder(tmp_path / "train", ["a"], per_class=1)
    path = str(root / "a" / "img_000.jpg")
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    [sample] = encode_sample((path, 3, 7, "a/img_000.jpg", None, None, str(kinds)))
    assert sample == {
        "image": (root / "a" / "img_000.jpg").read_bytes(),
        "label": 3,
        "index": 7,
        "name": "a/img_000.jpg",
    }
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not the rest")
    assert list(encode_sample((str(root / "a" / "broken.jpg"), 0, 0, "b", None, None, str(kinds)))) == []
    assert "skipping unreadable image" in capfd.readouterr().err
    # array-path data: a file of other channels than the folder's is left out
    assert list(encode_sample((path, 0, 0, "a", None, (1, "uint16"), str(kinds)))) == []
    assert noted_kinds(str(kinds)) == {(3, "uint8"): path}


def test_noted_kinds__each_kind_once_with_its_first_file_in_order(tmp_path):
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    gray = np.zeros((4, 4), np.uint16)
    for name in ("b.png", "a.png"):
        Image.fromarray(gray).save(tmp_path / name)
        note_kind(str(kinds), EncodedImage((tmp_path / name).read_bytes(), f"train:{name}"))
    note_kind(str(kinds), EncodedImage((tmp_path / "a.png").read_bytes(), "train:a.png"))  # noted already
    assert len(list(kinds.glob("*.json"))) == 1  # one note per kind and process
    assert noted_kinds(str(kinds)) == {(1, "uint16"): "train:b.png"}


def test_list_split_and_describe_pixels__as_the_folder_data_module_lists_and_reads(tmp_path):
    root = write_image_folder(tmp_path / "train", ["a", "b"], per_class=2)
    listing = list_split(root, ["a", "b"], max_per_class=1)
    assert listing == [
        (str(root / "a" / "img_000.jpg"), 0, "a/img_000.jpg"),
        (str(root / "b" / "img_000.jpg"), 1, "b/img_000.jpg"),
    ]
    assert describe_pixels(root, ["a", "b"]) == {"array": False, "pixels": [3, "uint8"]}
    np.save(root / "a" / "x.npy", np.zeros((4, 4, 2), np.float32))
    assert len(list_split(root, ["a"], None, arrays=True)) == 3 and len(list_split(root, ["a"], None)) == 2
    bands = tmp_path / "bands"  # the sample: the first file of each class
    for name, channels in (("c", 2), ("d", 3)):
        (bands / name).mkdir(parents=True)
        np.save(bands / name / "x.npy", np.zeros((4, 4, channels), np.float32))
    assert describe_pixels(bands, ["c"]) == {"array": True, "pixels": [2, "float32"]}
    with pytest.raises(
        ValueError, match="disagree: .*c/x.npy has 2 channel\\(s\\) of float32, .*d/x.npy has 3"
    ):
        describe_pixels(bands, ["c", "d"])
