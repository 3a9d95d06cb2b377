"""What a file is by its name (``mae.data.decoding.formats``): one table of image endings and readers for
datasets and own images, and a file's bytes held in memory (``EncodedImage``)."""

import io

from PIL import Image

from mae.data.decoding.formats import (
    ARRAY_EXTENSIONS,
    READERS,
    EncodedImage,
    dataset_extensions,
    is_array_file,
    reader_of,
    suffix_of,
)


def test_extensions__one_table_for_datasets_and_own_images():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert dataset_extensions(arrays=False) == IMG_EXTENSIONS  # the ImageFolder convention, in its order
    assert dataset_extensions(arrays=True) == (*dataset_extensions(arrays=False), ".npy")
    assert ".gif" in READERS and ".gif" not in dataset_extensions(arrays=True)  # given by name it is read
    assert [reader_of(name) for name in ("a.JPG", "b.TIF", "c.npy", "d.unknown")] == [
        "pil",
        "tiff",
        "npy",
        "pil",
    ]


def test_suffix_and_reader__of_a_path_or_of_a_sample_s_name_in_any_case():
    sample = EncodedImage(b"", "s3://bucket/train:cat/IMG_1.TIFF")
    assert suffix_of(sample) == ".tiff" and reader_of(sample) == "tiff" and is_array_file(sample)
    assert suffix_of("a/b.Npy") == ".npy" and is_array_file("a/b.Npy")
    assert not is_array_file("photo.JPEG") and not is_array_file("no_ending")
    assert ARRAY_EXTENSIONS == (".tif", ".tiff", ".npy")


def test_encoded_image__bytes_as_a_tensor_and_a_file_named_by_the_sample():
    buffer = io.BytesIO()
    Image.new("RGB", (5, 3), (1, 2, 3)).save(buffer, "PNG")
    for data in (buffer.getvalue(), bytearray(buffer.getvalue()), memoryview(buffer.getvalue())):
        image = EncodedImage(data, "shard:a/x.png")
        tensor = image.tensor()
        assert tensor.dtype.is_floating_point is False and bytes(tensor.numpy()) == buffer.getvalue()
        assert Image.open(image.file()).size == (5, 3)
    assert str(image) == "shard:a/x.png"
    assert repr(image) == f"EncodedImage(shard:a/x.png, {len(buffer.getvalue())} bytes)"
    held = bytearray(b"\xff\xd8")
    EncodedImage(held, "x.jpg").tensor()[0] = 0  # over the bytearray's own memory, not a copy
    assert held[0] == 0
