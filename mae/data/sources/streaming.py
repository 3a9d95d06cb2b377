"""Training from shards (``mae shard``) on local disk or object storage, through litdata.

litdata is Lightning's own streaming engine: it downloads shards ahead of use into a bounded local
cache, splits every epoch between processes and loader workers, shuffles shards and the samples in
them, and its ``StreamingDataLoader`` has a resumable state. ``StreamingDataModule`` saves that
state in each checkpoint and restores it, so a run resumed mid-epoch continues the stream where it
stopped.
"""

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.trainer.states import TrainerFn
from litdata import StreamingDataLoader, StreamingDataset
from torch.utils.data import DataLoader, Dataset

from mae.compat.litdata import read_whole_chunks
from mae.data.decoding.formats import EncodedImage
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import open_image, to_rgb
from mae.data.decoding.route import reads_as_rgb
from mae.data.decoding.units import check_channels
from mae.data.sources.base import SplitDataModule, collate_images
from mae.data.sources.layout import missing_train_split
from mae.data.sources.loader_workers import SigtermSafeLoader, main_process_worker_init
from mae.data.sources.shard_format import read_metadata
from mae.data.views.gpu import (
    DecodeOn,
    EncodedBatch,
    collate_encoded,
    decode_pretrain_batch,
    resolve_decode_on,
)
from mae.errors import ConfigError
from mae.io import storage


class DecodeSample:
    """A shard sample ``{"image": bytes, "label", "name", ...}`` -> (``transform``'s view, label).

    A transform that reads files (``PretrainCrop``) gets the bytes as an ``EncodedImage``; others a PIL
    image (converted to RGB by the transform). Without a transform the sample stays encoded, as a 1-D
    ``EncodedImage`` (for decoding whole batches on the GPU).
    """

    def __init__(
        self, transform: Callable | None, url: str, max_pixels: int | None = DEFAULT_MAX_PIXELS
    ) -> None:
        self.transform = transform
        self.url = url
        self.max_pixels = max_pixels

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        name, label = f"{self.url}:{sample['name']}", sample["label"]
        if (
            self.transform is None
        ):  # to the main process as it is (a copy: litdata's memoryview does not pickle)
            return EncodedImage(bytearray(sample["image"]), name), label
        encoded = EncodedImage(sample["image"], name)
        if getattr(self.transform, "reads_files", False):
            return self.transform(encoded), label
        with open_image(encoded, self.max_pixels) as img:
            return self.transform(to_rgb(img)), label


class ShardedImages(StreamingDataset):
    """One split of a shard folder as a litdata ``StreamingDataset`` of (image, label) samples.

    Args:
        url: the split's folder or ``s3://`` URL (holding litdata's ``index.json``).
        classes: class names, in label order.
        decode: ``DecodeSample`` applied to each sample.
        **kwargs: litdata ``StreamingDataset`` arguments (shuffle, seed, cache_dir, storage_options, ...).
    """

    def __init__(self, url: str, classes: list[str], decode: DecodeSample, **kwargs: Any) -> None:
        super().__init__(url, transform=decode, **kwargs)
        read_whole_chunks(self)  # also in the reader litdata builds on first use (see below)
        self.url = url
        self.classes = classes

    @property
    def on_demand_bytes(self) -> bool:
        """Always False: a sample read by index comes from its whole chunk, downloaded to the cache.

        litdata (0.2.76) otherwise reads a remote sample by byte range, assuming the plain chunk layout
        (item count, offsets, items). With pyarrow installed its writer stores Arrow-batched chunks
        whose offset table is a placeholder, so every ranged read came back empty and training from a
        bucket stopped at its first validation batch ("unpack_from requires a buffer of at least 16
        bytes"). The whole-chunk path reads every layout the writer makes; iteration (the training
        stream) already used it, and litdata turns ranged reads back on after each epoch through this
        setter."""
        return False

    @on_demand_bytes.setter
    def on_demand_bytes(self, value: bool) -> None:
        read_whole_chunks(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A loader worker started by spawn (not fork) has a fresh litdata: allow http endpoints there too.
        self.__dict__.update(state)
        storage.allow_plain_http(getattr(self, "storage_options", None))


class ShardIndex(Dataset):
    """A shard split read by index, the whole split in every process: the validation split (which the
    data module then gives each process exactly once, as it does for folders) and the feature sets of
    kNN and the probe (which run on one process and need all of it, while litdata's stream would give
    each DDP rank only its share).

    Args:
        shards: the split, unshuffled.
        count: its number of samples (``mae_shards.json``).
    """

    stored_in_random_order = True  # ``mae shard`` writes samples shuffled: the first N are a random N

    def __init__(self, shards: ShardedImages, count: int) -> None:
        self.shards = shards
        self.count = count
        self.classes = shards.classes

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if not 0 <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} samples of {self.shards.url}")
        return self.shards[index]


class ResumableStreamingLoader(SigtermSafeLoader, StreamingDataLoader):
    """litdata's ``StreamingDataLoader``, resumable under Lightning.

    - After a restore litdata replays the saved position at each ``__iter__`` until one iteration
      runs to exhaustion. Lightning reads an epoch of a loader with a length by count and never
      exhausts it, so without this the epoch after a mid-epoch resume would replay the resumed
      epoch's remainder instead of starting a new, reshuffled one.
    - A loader made by ``StreamingDataModule`` (``restored_by_data_module``) takes its position only
      from the data module (``restore_position``), which knows whether the checkpoint ended an
      epoch and where the shards are now; Lightning's own restore of the same checkpoint is ignored
      (it would replay a finished epoch when the worker count changed, and a second load advances
      litdata's worker cycle again).
    """

    restored_by_data_module = False

    def restore_position(self, state: dict[str, Any]) -> None:
        """Continue, at the next ``__iter__``, from ``state`` (litdata's ``state_dict``)."""
        super().load_state_dict(state)
        self._replayed = False

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        if self.restored_by_data_module:
            return
        self.restore_position(obj)

    def __iter__(self) -> Any:
        if self.restore and getattr(self, "_replayed", False):
            self.restore = False  # the resumed epoch was read to its end: start the next one afresh
        if self.restore:
            self._replayed = True
        yield from super().__iter__()


class StreamingDataModule(SplitDataModule):
    """Shards written by ``mae shard``, streamed from a folder or ``s3://`` URL.

    The transforms, batch, worker, ``img_size``, augmentation and normalisation settings are those
    of ``ImageDataModule``; the classes are the ones the shards were written with.

    Args:
        root: shard folder or ``s3://bucket/prefix`` (holding ``mae_shards.json``).
        train_split, val_split: split folders under ``root``; the validation split is skipped when
            the shards have none.
        cache_dir: local folder for downloaded shards (litdata's default cache when None); unused
            for local shards, which are read in place.
        max_cache_size: cache budget, e.g. "50GB".
        shuffle_seed: seed of the shard and sample order (reshuffled each epoch).
        storage_options: S3 client settings (``endpoint_url``, ``region_name``, keys); the
            environment's (``AWS_*``) when not set.
        decode_on: where pretraining crops are decoded: "cpu" (in loader workers), "gpu" (whole
            batches with nvJPEG, crop + flip on the GPU; workers only read bytes) or "auto" (gpu
            when training on CUDA with the pretraining augmentation).
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    def __init__(
        self,
        root: str,
        train_split: str = "train",
        val_split: str | None = "val",
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        shuffle_seed: int = 42,
        storage_options: dict[str, Any] | None = None,
        decode_on: DecodeOn = "auto",
        **kwargs: Any,
    ) -> None:
        root = str(root).rstrip("/") if storage.is_remote(root) else str(root)
        super().__init__(root, train_split, val_split, **kwargs)
        if self.train_fraction != 1.0:
            raise ConfigError(
                "data.train_fraction is not supported with streamed shards; write a labelled subset with "
                "`mae shard ... --max-images-per-class M` instead"
            )
        if decode_on not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"data.decode_on must be 'auto', 'cpu' or 'gpu', got {decode_on!r}")
        self.cache_dir = cache_dir
        self.max_cache_size = max_cache_size
        self.shuffle_seed = shuffle_seed
        self.storage_options = storage_options
        self.decode_on = decode_on
        self._metadata: dict[str, Any] | None = None
        self._gpu_decode = False
        self._train_loader: ResumableStreamingLoader | None = None
        self._stream_state: dict[str, Any] | None = (
            None  # restored from a checkpoint, for the next train loader
        )
        self._stream_epoch: int | None = None  # the epoch a checkpoint saved at an epoch's end had finished

    @property
    def metadata(self) -> dict[str, Any]:
        """The shards' ``mae_shards.json`` (read and checked once)."""
        if self._metadata is None:
            storage.allow_plain_http(self.storage_options)
            self._metadata = read_metadata(self.root, self.storage_options)
        return self._metadata

    @property
    def num_labels(self) -> int:
        return len(self.metadata["classes"])

    def configure_pixels(self) -> None:
        """As the folder module decides from its files, from what the shard tool recorded: 8-bit images
        with 3 channels take the uint8 path (and may be decoded on the GPU), other channel counts
        (``in_chans``), 16-bit, float, TIFF and ``.npy`` data the array path.

        Raises:
            ValueError: channels that do not fit ``in_chans``, or array-path reading of shards whose
                images differ in channels; ``decode_on: gpu`` for array-path data.
        """
        self.array_mode = not reads_as_rgb(self.in_chans, not self.metadata.get("array", False))
        if self.array_mode:
            pixels = self.metadata.get("pixels")
            if pixels is None:
                shown = "; ".join(
                    f"{name} has {c} channel(s) of {dtype}"
                    for c, dtype, name in self.metadata.get("kinds", [])[:2]
                )
                raise ConfigError(
                    f"the images in {self.root} differ in channels or bit depth "
                    f"({shown or 'e.g. RGB and grayscale'}), which only the 8-bit RGB path converts: "
                    f"data.in_chans must be 3 for them, got {self.in_chans}"
                )
            self.expected_pixels = (int(pixels[0]), str(pixels[1]))
            check_channels(self.expected_pixels[0], self.in_chans, self.root)
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        augmentation = "array" if self.array_mode else self.augmentation
        self._gpu_decode = resolve_decode_on(self.decode_on, device, augmentation)

    def train_image_count(self) -> int:
        return self.metadata["splits"][self.train_split]["images"]  # litdata's length is this process's share

    def train_transform(self) -> Callable | None:
        return None if self._gpu_decode else super().train_transform()

    def _split(self, split: str, transform: Callable | None, train: bool) -> ShardedImages:
        url = storage.join(self.root, split)
        return ShardedImages(
            url,
            self.metadata["classes"],
            DecodeSample(transform, url, self.max_image_pixels),
            shuffle=train,
            seed=self.shuffle_seed,
            cache_dir=self.cache_dir,
            max_cache_size=self.max_cache_size,
            storage_options=dict(self.storage_options or {}),
        )

    def _indexed(self, split: str, transform: Callable) -> ShardIndex:
        return ShardIndex(
            self._split(split, transform, train=False), self.metadata["splits"][split]["images"]
        )

    def _val_set(self, transform: Callable) -> ShardIndex | None:
        if self.val_split is None or self.val_split not in self.metadata["splits"]:
            return None
        return self._indexed(self.val_split, transform)

    def _check_train_split(self) -> None:
        splits = list(self.metadata["splits"])
        if self.train_split not in splits:
            raise missing_train_split(
                self.root, self.train_split, splits, "data.train_split", "a split written by mae shard"
            )

    def build_datasets(self, train_tf: Callable | None, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        self._check_train_split()
        return self._split(self.train_split, train_tf, train=True), self._val_set(eval_tf)

    def feature_datasets(self) -> tuple[Dataset, Dataset | None]:
        self.configure_pixels()
        self._check_train_split()
        return self._indexed(self.train_split, self.eval_transform()), self._val_set(self.eval_transform())

    def state_dict(self) -> dict[str, Any]:
        """The training stream's position, saved in every checkpoint (``load_state_dict`` restores it),
        with what it depends on: the shuffle seed and which conversion of the shards it reads."""
        trainer = self.trainer
        if self._train_loader is None or trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        return {
            "stream": self._train_loader.state_dict(),
            # saved at an epoch's end: the next epoch starts afresh, whatever the loader's count says
            "epoch_finished": progress.ready >= trainer.num_training_batches,
            "shuffle_seed": self.shuffle_seed,
            "shards_id": self.metadata.get("id"),
            "train_images": self.metadata["splits"][self.train_split]["images"],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training stream where the checkpoint left it (when fitting; an evaluation of a
        checkpoint reads no stream).

        Lightning restores a stateful loader itself only when it builds the loader after the
        checkpoint is read; a module whose ``configure_optimizers`` or ``setup`` asks for
        ``trainer.estimated_stepping_batches`` (ours: the lr schedule) makes it build the loader
        first, and the saved position would be skipped silently, restarting the epoch.

        Raises:
            ValueError: a different ``data.shuffle_seed``, or other shards (another conversion, even
                of the same images) than the checkpoint's: the resumed epoch would repeat and skip
                images. Names both values.
        """
        self._stream_state = self._stream_epoch = None
        if "stream" not in state_dict or self.trainer is None or self.trainer.state.fn != TrainerFn.FITTING:
            return
        if state_dict.get("epoch_finished"):
            # the next epoch starts afresh, numbered after the saved one (litdata seeds its shuffle with it)
            self._stream_epoch = state_dict["stream"].get("current_epoch")
            self._restore_stream(self._train_loader)
            return
        saved_seed = state_dict.get("shuffle_seed", self.shuffle_seed)
        if saved_seed != self.shuffle_seed:
            raise ConfigError(
                f"data.shuffle_seed is {self.shuffle_seed} but the checkpoint's epoch was streamed with "
                f"{saved_seed}: resume with --data.shuffle_seed {saved_seed} (another order would repeat and "
                "skip images of the interrupted epoch)"
            )
        saved = (state_dict.get("shards_id"), state_dict.get("train_images"))
        current = (self.metadata.get("id"), self.metadata["splits"][self.train_split]["images"])
        if saved != current and None not in saved:
            raise ConfigError(
                f"the checkpoint's epoch streamed the shards {saved[0]} ({saved[1]} training images), but "
                f"{self.root} holds {current[0]} ({current[1]}), another conversion: its order differs, so "
                "resuming mid-epoch would repeat and skip images. Resume on the checkpoint's shards, or "
                "start a new run from the weights (model.init_from)"
            )
        self._stream_state = state_dict["stream"]
        self._restore_stream(self._train_loader)

    def _restore_stream(self, loader: "ResumableStreamingLoader | None") -> None:
        """Apply the checkpoint's stream position (or, after a finished epoch, its epoch number) to
        ``loader`` now, or to the next train loader made: with the shards' and cache's current
        locations (the shards may have been copied elsewhere, the cache be on another node's disk)."""
        if loader is None:
            return
        if self._stream_epoch is not None:
            loader.current_epoch = self._stream_epoch
            self._stream_epoch = None
        if self._stream_state is not None:
            state = {**self._stream_state, "dataset": dict(self._stream_state["dataset"])}
            dataset = loader.dataset
            state["dataset"].update(
                input_dir_path=dataset.input_dir.path,
                input_dir_url=dataset.input_dir.url,
                cache_dir_path=self.cache_dir,
            )
            loader.restore_position(state)
            self._stream_state = None

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        if not train:  # read by index: each validation image exactly once across processes
            return super()._loader(dataset, train=False)
        encoded = self._gpu_decode
        self._train_loader = ResumableStreamingLoader(
            dataset,
            batch_size=self.batch_size,
            drop_last=True,
            collate_fn=collate_encoded if encoded else collate_images,
            num_workers=self.num_workers,
            worker_init_fn=main_process_worker_init(),
            pin_memory=self.pin_memory and torch.cuda.is_available() and not encoded,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )
        self._train_loader.restored_by_data_module = True
        self._restore_stream(self._train_loader)
        return self._train_loader

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # nvJPEG takes the encoded bytes from host memory and writes the pixels on the GPU.
        if isinstance(batch, EncodedBatch):
            device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
            size = (self.img_size, self.img_size) if isinstance(self.img_size, int) else tuple(self.img_size)
            return [
                decode_pretrain_batch(batch.images, batch.names, size, device, self.max_image_pixels),
                batch.labels,
            ]
        return batch
