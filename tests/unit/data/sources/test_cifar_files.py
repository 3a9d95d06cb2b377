"""CIFAR's python files (``mae.data.sources.cifar_files``) read with only the types CIFAR's files hold: the
files as CIFAR-10's release pickles them (Python 2, protocol 2, ``numpy.core``) and as Python 3 writes them
read to the same pixels; a file naming anything else is refused by name before any of it runs; a label
outside the dataset's classes is named with its file."""

import pickle
import warnings

import numpy as np
import pytest

from benchmarks.dogs_n_cats import _pickle_py2
from mae.data.sources.cifar_files import (
    CIFAR_LAYOUTS,
    CIFARFiles,
    read_cifar_batch,
    read_cifar_classes,
    read_cifar_pickle,
)
from mae.errors import InputError
from tests.helpers import CreatesFolder, call_pickle, write_cifar

CIFAR10 = CIFAR_LAYOUTS["cifar10"]
ROWS = np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8)


def test_read_cifar_batch__cifar10s_own_python2_pickle_reads_without_a_warning(tmp_path):
    path = tmp_path / "data_batch_1"
    labels = [1, 2, 3, 4]
    path.write_bytes(
        _pickle_py2(
            {b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": ROWS, b"filenames": []}
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy.core is named, and not imported
        images, read = read_cifar_batch(path, CIFAR10, "cifar10")
    assert read == labels and images.shape == (4, 32, 32, 3)
    assert np.array_equal(images.transpose(0, 3, 1, 2).reshape(4, -1), ROWS)  # CIFAR's planes, as RGB


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_read_cifar_batch__python3_pickles_of_every_protocol_read(tmp_path, protocol):
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": ROWS, "labels": [0, 1, 2, 9]}, protocol=protocol))
    images, labels = read_cifar_batch(path, CIFAR10, "cifar10")
    assert labels == [0, 1, 2, 9] and np.array_equal(images.transpose(0, 3, 1, 2).reshape(4, -1), ROWS)


PAYLOADS = {  # (module, name): each reaches a function that is not CIFAR's
    "os.mkdir": ("os", "mkdir"),
    "posix.mkdir": ("posix", "mkdir"),
    "builtins.eval": ("builtins", "eval"),
    "os.mkdir through numpy": ("numpy", "os.mkdir"),
    "a dotted path through an allowed function": ("numpy._core.multiarray", "_reconstruct.__globals__.get"),
    "codecs.encode's neighbour": ("_codecs", "decode"),
}


@pytest.mark.parametrize("stack_global", [True, False], ids=["STACK_GLOBAL", "GLOBAL"])
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_read_cifar_pickle__a_file_naming_another_object_is_refused_and_runs_nothing(
    tmp_path, payload, stack_global
):
    module, name = PAYLOADS[payload]
    target = tmp_path / "created_by_the_file"
    args = (f"__import__('os').mkdir({str(target)!r})",) if name == "eval" else (str(target),)
    path = tmp_path / "data_batch_1"
    path.write_bytes(call_pickle(module, name, args, stack_global))
    with pytest.raises(InputError, match=rf"{path} would run code when loaded \(GLOBAL {module}\.{name}\)"):
        read_cifar_pickle(path, CIFAR10)
    assert not target.exists()


def test_read_cifar_pickle__a_latin1_encode_with_another_codec_is_refused(tmp_path):
    path = tmp_path / "test_batch"
    path.write_bytes(call_pickle("_codecs", "encode", ("x", "rot13"), stack_global=False))
    with pytest.raises(
        InputError, match=r"would run code when loaded \(GLOBAL _codecs\.encode with the encod"
    ):
        read_cifar_pickle(path, CIFAR10)


@pytest.mark.parametrize("name", ["data_batch_3", "test_batch", "batches.meta"])
def test_cifar_files__a_payload_in_any_file_is_refused_by_name_before_it_runs(tmp_path, name):
    write_cifar(tmp_path, "cifar10", train_per_batch=2, test=2)
    folder = tmp_path / "cifar-10-batches-py"
    target = tmp_path / "created_by_the_file"
    (folder / name).write_bytes(pickle.dumps({"data": CreatesFolder(target), "labels": []}))
    with pytest.raises(
        InputError, match=rf"{folder / name} would run code when loaded \(GLOBAL posix\.mkdir\)"
    ):
        for train in (True, False):
            CIFARFiles(folder, "cifar10", train=train)
    assert not target.exists()


def test_read_cifar_batch__a_label_outside_the_classes_is_named_with_its_file(tmp_path):
    path = tmp_path / "data_batch_2"
    path.write_bytes(pickle.dumps({"data": ROWS, "labels": [0, 19, 3, 12]}))
    with pytest.raises(InputError) as err:
        read_cifar_batch(path, CIFAR10, "cifar10")
    assert str(err.value) == (
        f"{path} holds the label 19, outside CIFAR-10's 10 classes (0-9); set data.dataset to the dataset "
        "these files hold (now cifar10), or replace the file with the one of that name from the official "
        "cifar-10-python.tar.gz"
    )
    path.write_bytes(pickle.dumps({"data": ROWS, "labels": [0, -1, 3, 2]}))
    with pytest.raises(InputError, match="holds the label -1, outside"):
        read_cifar_batch(path, CIFAR10, "cifar10")


@pytest.mark.parametrize(
    "content, why",
    [
        (pickle.dumps({"data": ROWS})[:40], "EOFError|UnpicklingError"),  # cut short
        (pickle.dumps({"labels": [1]}), "no 'data' entry"),
        (pickle.dumps({"data": ROWS[:, :100], "labels": [0] * 4}), "not uint8 rows of 3072 values"),
        (pickle.dumps({"data": ROWS, "labels": [0, 1]}), "2 labels for 4 images"),
        (pickle.dumps([1, 2]), "TypeError"),
        (b"not a pickle", "UnpicklingError"),
    ],
)
def test_read_cifar_batch__a_damaged_file_is_named(tmp_path, content, why):
    path = tmp_path / "data_batch_1"
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"{path} is not a readable CIFAR python-pickle file \(.*({why})"):
        read_cifar_batch(path, CIFAR10, "cifar10")


def test_read_cifar_classes__names_of_a_python2_meta_file(tmp_path):
    path = tmp_path / "batches.meta"
    path.write_bytes(_pickle_py2({b"label_names": [b"airplane", b"automobile"], b"num_vis": 3072}))
    assert read_cifar_classes(path, CIFAR10) == ["airplane", "automobile"]
    path.write_bytes(pickle.dumps({"label_names": "airplane"}))
    with pytest.raises(InputError, match="label_names is a str, not a list of names"):
        read_cifar_classes(path, CIFAR10)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
@pytest.mark.parametrize("train", [True, False])
def test_cifar_files__serve_what_torchvisions_reader_serves(tmp_path, dataset, train):
    """Parity with torchvision's own CIFAR reader on the same (trusted) files: the same images, labels,
    order and class names."""
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10
    from torchvision.datasets import CIFAR100 as TorchvisionCIFAR100

    write_cifar(tmp_path, dataset, train_per_batch=6, test=5, seed=3)
    folder = tmp_path / CIFAR_LAYOUTS[dataset].folder
    reference_class = TorchvisionCIFAR10 if dataset == "cifar10" else TorchvisionCIFAR100
    # torchvision checks the release's md5 sums: these files are ours, so only their presence is checked
    reference_class = type(
        "Unchecked",
        (reference_class,),
        {
            "train_list": [[name, None] for name, _ in reference_class.train_list],
            "test_list": [[name, None] for name, _ in reference_class.test_list],
            "meta": {**reference_class.meta, "md5": None},
        },
    )
    reference = reference_class(str(tmp_path), train=train)
    ours = CIFARFiles(folder, dataset, train=train)
    assert len(ours) == len(reference) == (30 if train else 5)
    assert ours.targets == reference.targets
    assert ours.classes == reference.classes
    np.testing.assert_array_equal(ours.data, reference.data)
    for index in (0, len(ours) - 1):
        (image, label), (expected, expected_label) = ours[index], reference[index]
        assert label == expected_label
        np.testing.assert_array_equal(np.asarray(image), np.asarray(expected))
