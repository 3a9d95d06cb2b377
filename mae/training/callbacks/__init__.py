"""Lightning callbacks of the training runs: figures, monitors and fault handling."""

from mae.training.callbacks.ema import EMA
from mae.training.callbacks.health import RunHealth
from mae.training.callbacks.knn import KNNCallback
from mae.training.callbacks.nonfinite import NonFiniteCapture
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
    "EMA",
    "PREEMPTED_EXIT_CODE",
    "ImageThroughputMonitor",
    "ProbeCallback",
    "KNNCallback",
    "NonFiniteCapture",
    "RunHealth",
    "PreemptionSignals",
    "ReconstructionCallback",
    "RemoveOrphanTemporaries",
    "SigtermCheckpoint",
    "harden_trainer",
]
