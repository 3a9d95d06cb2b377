"""The files of an embedding index (``mae embed``), written whole and read in chunks.

Two layouts hold the same rows (one image each: its path, its label or none, its vector) and the same
record of how they were made (``IndexMeta``):

- ``FILE.parquet``: columns ``path`` (string), ``label`` (string, null outside a class folder) and
  ``vector`` (fixed-size list of float32); the record is the file's key-value metadata under
  ``mae_embeddings`` (JSON). Needs pyarrow (the ``embed`` extra).
- ``FILE.npy``: the (N, D) float32 vectors, with ``FILE.csv`` (``path,label`` per row, in the same order;
  empty label outside a class folder) and ``FILE.json`` (the record) beside it. Needs numpy only.
"""

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from mae.errors import InputError, MissingFileError
from mae.inference.normalization import Normalization
from mae.io.atomic import atomic_write
from mae.io.outputs import Output

INDEX_VERSION = 1
METADATA_KEY = b"mae_embeddings"
SUFFIXES = (".parquet", ".npy")
REBUILD = "rebuild the index with mae embed"
# What makes two runs' vectors comparable (and a stopped run resumable): everything but the outcome.
RUN_FIELDS = ("fingerprint", "pool", "dim", "img_size", "in_chans", "mean", "std", "inputs", "feature_blocks")
# Fields a record written before they existed lacks, and what such a record means by them.
LATER_FIELDS = {"feature_blocks": None}


@dataclass
class IndexMeta:
    """How an index was made, and what it holds.

    Attributes:
        checkpoint: the encoder's checkpoint (absolute path when written).
        fingerprint: ``mae.apps.embeddings.embedder.weights_fingerprint`` of its weights.
        pool: "cls", "avg" or "both".
        dim: D, the length of each vector.
        img_size: [H, W], the encoder's input size in pixels.
        in_chans, mean, std: how the images were normalised.
        inputs: SHA-256 of the listed images (paths and labels, in order): the run's inputs.
        count: N, the rows written.
        skipped: {"path", "error"} of each image that could not be read.
        feature_blocks: the encoder blocks read, from 0 (several: concatenated); None: the last alone.
    """

    checkpoint: str
    fingerprint: str
    pool: str
    dim: int
    img_size: list[int]
    in_chans: int
    mean: list[float]
    std: list[float]
    inputs: str = ""
    count: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    version: int = INDEX_VERSION
    feature_blocks: list[int] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes, source: str | Path) -> "IndexMeta":
        """Raises:
        ValueError: not this record, or a version this code does not read, naming ``source``.
        """
        try:
            record = json.loads(text)
            version = record.get("version")
            if version != INDEX_VERSION:
                raise InputError(
                    f"{source} is an index of version {version!r}; this code reads version "
                    f"{INDEX_VERSION}: rebuild it with mae embed"
                )
            return cls(**{f.name: _field(record, f.name) for f in fields(cls)})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise InputError(
                f"{source} has a damaged index record ({err}): rebuild it with mae embed"
            ) from err

    def run(self) -> dict:
        """The fields that say how the vectors were made (``RUN_FIELDS``)."""
        return {name: getattr(self, name) for name in RUN_FIELDS}

    def norm(self) -> Normalization:
        return Normalization(self.in_chans, tuple(self.mean), tuple(self.std))


def _field(record: dict, name: str):
    """``record[name]``; a field added since version 1 (``LATER_FIELDS``) missing means its old meaning."""
    return record.get(name, LATER_FIELDS[name]) if name in LATER_FIELDS else record[name]


@dataclass
class Rows:
    """Consecutive rows of an index: ``paths`` and ``labels`` (None outside a class folder), and their
    ``vectors`` (n, D) float32."""

    paths: list[str]
    labels: list[str | None]
    vectors: np.ndarray


def check_suffix(path: str | Path) -> Path:
    """Raises:
    ValueError: ``path`` does not end in .parquet or .npy.
    """
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise InputError(f"an index file must end in .parquet (Parquet) or .npy (numpy + CSV), got {path}")
    return path


def companions(path: Path) -> tuple[Path, Path]:
    """The CSV of paths and the JSON record beside ``FILE.npy``."""
    return path.with_suffix(".csv"), path.with_suffix(".json")


def write_index(path: str | Path, meta: IndexMeta, rows: Iterable[Rows]) -> Path:
    """Write ``rows`` (in order; ``meta.count`` rows in all) as the index ``path`` (.parquet or .npy), each
    file atomically; for .npy the JSON record first, then the CSV, the vectors last. ``rows`` may be iterated
    more than once (e.g. parts read from disk on each pass); memory: one ``Rows`` at a time."""
    path = check_suffix(path)
    if path.suffix == ".parquet":
        return atomic_write(path, lambda tmp: _write_parquet(tmp, meta, rows))
    csv_path, json_path = companions(path)

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "label"])
            for part in rows:
                writer.writerows(
                    (p, "" if label is None else label)
                    for p, label in zip(part.paths, part.labels, strict=True)
                )

    def write_vectors(tmp: Path) -> None:
        vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(meta.count, meta.dim))
        start = 0
        for part in rows:
            vectors[start : start + len(part.paths)] = part.vectors
            start += len(part.paths)
        vectors.flush()
        del vectors

    # The record first: it is what marks the CSV and the vectors as this module's (``is_index``), also
    # when a kill stops the write between the files.
    atomic_write(json_path, lambda tmp: tmp.write_text(meta.to_json()))
    atomic_write(csv_path, write_csv)
    return atomic_write(path, write_vectors, size=meta.count * meta.dim * 4)


def is_index(path: Path) -> bool:
    """Whether ``path`` (``FILE.parquet``, or ``FILE.npy`` / its CSV / its JSON) belongs to an index this
    module wrote: the Parquet file's ``METADATA_KEY`` record, or the JSON record beside the .npy."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            return METADATA_KEY in (_pyarrow().parquet.read_schema(path).metadata or {})
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            return False
    try:
        IndexMeta.from_json(companions(path.with_suffix(".npy"))[1].read_text(), path)
    except (OSError, ValueError):
        return False
    return True


def index_outputs(path: Path) -> list[Output]:
    """The files of the index ``path`` as outputs to check (``mae.io.outputs``)."""
    path = check_suffix(path)
    if path.suffix == ".parquet":
        return [Output(path, "--out", ours=is_index)]
    return [Output(path, "--out", ours=is_index)] + [
        Output(p, "beside --out", ours=is_index) for p in companions(path)
    ]


def _csv_rows(path: Path) -> int:
    """The number of (path, label) rows of an index's CSV, under its header.

    Raises:
        ValueError: a row that is not two fields, naming the file and the line.
    """
    with open(path, newline="") as f:
        reader = csv.reader(f)
        lines = 0
        for row in reader:
            if len(row) != 2:
                raise InputError(
                    f"{path} line {reader.line_num} has {len(row)} field(s), not path,label: {REBUILD}"
                )
            lines += 1
    return max(lines - 1, 0)  # the header is no row


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as err:
        raise InputError(
            f'Parquet files need pyarrow: pip install -e ".[embed]", or use an .npy index ({err})'
        ) from None
    return pyarrow


def _write_parquet(tmp: Path, meta: IndexMeta, rows: Iterable[Rows]) -> None:
    pa = _pyarrow()
    schema = pa.schema(
        [("path", pa.string()), ("label", pa.string()), ("vector", pa.list_(pa.float32(), meta.dim))],
        metadata={METADATA_KEY: meta.to_json()},
    )
    with pa.parquet.ParquetWriter(tmp, schema) as writer:
        for part in rows:
            if not part.paths:
                continue
            vectors = pa.FixedSizeListArray.from_arrays(
                pa.array(part.vectors.reshape(-1), pa.float32()), meta.dim
            )
            writer.write_table(
                pa.table(
                    [pa.array(part.paths, pa.string()), pa.array(part.labels, pa.string()), vectors],
                    schema=schema,
                )
            )


class EmbeddingIndex:
    """An index on disk (.parquet or .npy), read in chunks: ``meta``, ``len(index)``, ``vector_chunks``,
    ``rows_at``.

    Raises (on opening):
        FileNotFoundError: a missing file (for .npy: or its CSV / JSON).
        ValueError: a file that is not an index of ``mae embed``, or whose vectors disagree with
            its record.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = check_suffix(path)
        if not self.path.is_file():
            raise MissingFileError(f"index {self.path} does not exist: build it with mae embed")
        if self.path.suffix == ".parquet":
            self._open_parquet()
        else:
            self._open_npy()

    def __len__(self) -> int:
        return self.meta.count

    def _open_parquet(self) -> None:
        pa = _pyarrow()
        try:
            # pre_buffer would read every row group ahead: memory growing with the index, not the chunk
            self._file = pa.parquet.ParquetFile(self.path, pre_buffer=False, buffer_size=1 << 20)
        except pa.ArrowException as err:
            raise InputError(f"{self.path} is not a readable Parquet file ({err})") from None
        record = (self._file.schema_arrow.metadata or {}).get(METADATA_KEY)
        if record is None:
            raise InputError(
                f"{self.path} is a Parquet file without an embedding record (no {METADATA_KEY.decode()} "
                "metadata): it was not written by mae embed"
            )
        self.meta = IndexMeta.from_json(record, self.path)
        vector = self._file.schema_arrow.field("vector").type
        if (
            self._file.metadata.num_rows != self.meta.count
            or getattr(vector, "list_size", None) != self.meta.dim
        ):
            raise InputError(
                f"{self.path} holds {self._file.metadata.num_rows} rows of {vector} but its record says "
                f"{self.meta.count} of {self.meta.dim}: rebuild it with mae embed"
            )

    def _open_npy(self) -> None:
        csv_path, json_path = companions(self.path)
        for needed in (csv_path, json_path):
            if not needed.is_file():
                raise MissingFileError(
                    f"{needed} is missing: an .npy index is {self.path.name} with "
                    f"{csv_path.name} and {json_path.name} beside it"
                )
        self.meta = IndexMeta.from_json(json_path.read_text(), json_path)
        try:  # a header that promises more rows than the file holds fails here, before any row is read
            self._vectors = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise self._damaged(self.path, err) from None
        if self._vectors.shape != (self.meta.count, self.meta.dim) or self._vectors.dtype != np.float32:
            raise InputError(
                f"{self.path} holds {self._vectors.dtype} {self._vectors.shape} but {json_path.name} says "
                f"float32 ({self.meta.count}, {self.meta.dim}): {REBUILD}"
            )
        rows = _csv_rows(csv_path)
        if rows != self.meta.count:
            raise InputError(
                f"{csv_path} lists {rows} image(s) but {self.path.name} holds {self.meta.count} vectors: "
                f"the files are of different runs or one was cut short; {REBUILD}"
            )

    @staticmethod
    def _damaged(path: Path, err: BaseException) -> InputError:
        said = " ".join(str(err).split())  # pyarrow's messages run over several lines
        return InputError(f"{path} is damaged or cut short ({type(err).__name__}: {said}); {REBUILD}")

    def vector_chunks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, (n, D) float32 vectors) of ``rows`` rows at a time, in order.

        Raises:
            ValueError: a Parquet page that cannot be read (damaged), naming the file.
        """
        if self.path.suffix == ".npy":
            for start in range(0, len(self), rows):
                yield start, torch.from_numpy(np.array(self._vectors[start : start + rows]))
            return
        start = 0
        for batch in self._batches(rows, ["vector"]):
            values = batch.column(0).flatten().to_numpy(zero_copy_only=False).reshape(-1, self.meta.dim)
            yield start, torch.from_numpy(np.array(values))
            start += len(values)

    def _batches(self, rows: int, columns: list[str]):
        """The Parquet file's record batches; a page that cannot be read is named as damage."""
        batches = self._file.iter_batches(batch_size=rows, columns=columns)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (OSError, ValueError) as err:  # pyarrow's errors are OSError / ValueError subclasses
                raise self._damaged(self.path, err) from None
            yield batch

    def rows_at(self, indices: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """{row: (path, label)} of the rows ``indices``, read in one pass."""
        wanted = set(indices)
        found = {}
        if self.path.suffix == ".npy":
            with open(companions(self.path)[0], newline="") as f:
                for row, (path, label) in enumerate(csv.reader(f), start=-1):  # -1: the header
                    if row in wanted:
                        found[row] = (path, label or None)
            return found
        start = 0
        for batch in self._batches(65536, ["path", "label"]):
            for row in sorted(i - start for i in wanted if start <= i < start + batch.num_rows):
                found[start + row] = (batch.column(0)[row].as_py(), batch.column(1)[row].as_py())
            start += batch.num_rows
        return found
