"""Lightning callbacks of the training runs: figures, monitors and fault handling."""

from mae.training.callbacks.knn import KNNCallback
from mae.training.callbacks.preemption import (
    PREEMPTED_EXIT_CODE,
    PreemptionSignals,
    RemoveOrphanTemporaries,
    SigtermCheckpoint,
    harden_trainer,
)
from mae.training.callbacks.probe import ProbeCallback
from mae.training.callbacks.reconstruction import ReconstructionCallback
from mae.training.callbacks.throughput import ImageThroughputMonitor

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "ImageThroughputMonitor",
    "ProbeCallback",
    "KNNCallback",
    "PreemptionSignals",
    "ReconstructionCallback",
    "RemoveOrphanTemporaries",
    "SigtermCheckpoint",
    "harden_trainer",
]
