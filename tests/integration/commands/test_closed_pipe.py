"""A reader that stops early (``mae recipes --show default | head -1``): the command ends quietly with a
closed pipe's status, as ``git log | head`` does, not with a ``BrokenPipeError`` traceback."""

import subprocess
import sys

import pytest

from mae.cli.main import BROKEN_PIPE_EXIT_CODE
from tests.helpers import REPO


# ``mae --help`` writes before any command runs; ``mae recipes`` (its list, 5 KB) as a command does, through
# ``run_command``: the same buffered print as ``mae recipes --show default | head -1``, which found it,
# without importing Lightning for the recipe's defaults
@pytest.mark.parametrize("argv", [["--help"], ["recipes"]], ids=["help", "recipes"])
def test_output_into_a_closed_pipe__no_traceback(argv):
    child = subprocess.Popen(
        [sys.executable, "-m", "mae", *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    child.stdout.close()  # the reader is gone before the command writes a byte
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == BROKEN_PIPE_EXIT_CODE, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr.decode()
