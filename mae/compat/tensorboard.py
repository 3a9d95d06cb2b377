"""Private names of PyTorch's TensorBoard writer, ``torch.utils.tensorboard`` (tested with torch 2.14.1
and tensorboard 2.21.0).

- ``SummaryWriter._get_file_writer``: the writer's event file, made on first use (with the purge of a
  resumed run's later events). The public ``add_hparams`` writes the HPARAMS tab into a new folder of
  its own, apart from the run's curves; ``add_summary`` on the file writer puts it beside them.
"""

from typing import Any


def event_file_writer(writer: Any) -> Any:
    """The ``FileWriter`` of ``writer`` (a ``SummaryWriter``), made now if it has none yet."""
    return writer._get_file_writer()
