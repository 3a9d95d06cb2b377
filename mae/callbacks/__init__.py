"""Lightning callbacks of the pipeline."""

from mae.callbacks.reconstruction import ReconstructionCallback
from mae.callbacks.throughput import ImageThroughputMonitor

__all__ = ["ImageThroughputMonitor", "ReconstructionCallback"]
