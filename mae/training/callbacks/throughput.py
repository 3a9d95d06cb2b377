"""Images/s (and FLOP/s, MFU on known GPUs) via Lightning's ThroughputMonitor."""

from typing import Any

from lightning.pytorch.callbacks import ThroughputMonitor


def _batch_size(batch: Any) -> int:
    images = batch[0]
    return len(images) if isinstance(images, list | tuple) else images.shape[0]  # detectors take image lists


class ImageThroughputMonitor(ThroughputMonitor):
    """ThroughputMonitor for ``(images, labels)`` batches (images a tensor or a list). Logs
    ``train/device/samples_per_sec`` (images/s per device) and, with several devices,
    ``train/samples_per_sec``.

    Args:
        window_size: steps averaged per measurement.
    """

    def __init__(self, window_size: int = 10) -> None:
        super().__init__(batch_size_fn=_batch_size, window_size=window_size)
