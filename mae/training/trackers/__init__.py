"""Experiment trackers beside the run's CSV metrics: TensorBoard, MLflow and Weights & Biases.

A training command's ``tracker`` key names one of Lightning's loggers (``class_path``) with the
tracker's own settings (``init_args``: MLflow's ``tracking_uri`` and ``experiment_name``, W&B's
``project``, ``entity`` and ``mode``, ...). Before any work and before the run folder is made, what can
refuse it is checked (``tracker_spec``, ``check_tracker``): its settings, the run folder's record, the
folders it writes, its store (reached within seconds) and credentials. It is built once the run has
passed its start-up checks (``AttachTracker``), and what ties it to the run folder is filled in, so
that a resumed run (a SIGTERM checkpoint, then the same command line with ``--ckpt_path last``)
continues the same tracked run: TensorBoard's event folder is named after the run folder
(``tensorboard.py``), MLflow's and W&B's run ids are kept in ``<run folder>/tracker.json`` (``mlflow.py``,
``wandb.py``).

The tracker gets every scalar the run logs (Lightning sends them to all loggers), the figures
(``log_figure``), the run's settings (``run_settings``: the resolved config, effective batch and lr, the
architecture record, package versions) and, where its ``log_model`` asks for them, the checkpoints.
Only global rank 0 talks to a tracker (Lightning's loggers and the calls here); no call waits on the
other processes. Each call waits a bounded time, and a tracker whose service stops answering mid-run is
left for the rest of the run with one warning, not the run (``outage.py``).

Each tracker is one ``Tracker`` subclass (``base.py``): a new one is a class registered with
``register_tracker`` (imported below) and a recipe in ``mae/configs/loggers/`` naming its logger.
"""

from mae.training.trackers.attach import AttachTracker, attach_tracker, log_figure, trackers_of, where_to_look
from mae.training.trackers.base import TRACKERS, Tracker, register_tracker, tracker_of, tracker_type
from mae.training.trackers.build import build_tracker, check_tracker, remember_run, tracker_spec
from mae.training.trackers.mlflow import MLflowTracker
from mae.training.trackers.record import TRACKER_FILE
from mae.training.trackers.settings import NOT_INSTALLED, VERSIONED_PACKAGES, package_versions, run_settings
from mae.training.trackers.tensorboard import TensorBoardTracker
from mae.training.trackers.wandb import WandbTracker

__all__ = [
    "NOT_INSTALLED",
    "TRACKERS",
    "TRACKER_FILE",
    "VERSIONED_PACKAGES",
    "AttachTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "attach_tracker",
    "build_tracker",
    "check_tracker",
    "log_figure",
    "package_versions",
    "register_tracker",
    "remember_run",
    "run_settings",
    "tracker_of",
    "tracker_spec",
    "tracker_type",
    "trackers_of",
    "where_to_look",
]
