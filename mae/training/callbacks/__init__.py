"""Lightning callbacks of the training runs: figures, monitors and fault handling."""

from mae.training.callbacks.knn import KNNCallback
from mae.training.callbacks.reconstruction import ReconstructionCallback
from mae.training.callbacks.sigterm import SigtermCheckpoint
from mae.training.callbacks.throughput import ImageThroughputMonitor

__all__ = ["ImageThroughputMonitor", "KNNCallback", "ReconstructionCallback", "SigtermCheckpoint"]
