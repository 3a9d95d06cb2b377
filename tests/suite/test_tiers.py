"""The suite's own machinery: a test's folder (and its markers) decide its tier, an unmarked test that
starts an interpreter fails naming the fix, a hung test fails alone, and a forked command behaves as the
same command in a fresh interpreter."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.forked_commands import run_forked
from tests.helpers import REPO, run_mae, run_mae_process


def _forked(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` as a forked child of the preloaded server (what ``run_mae`` runs ``mae`` in)."""
    return run_forked([script, *args], REPO, timeout)


def _fresh(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` in a fresh interpreter (``Popen``: the tier rule marks its tests slow)."""
    command = [sys.executable, script, *args]
    with subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A scratch suite with this suite's conftest and pyproject settings (markers, strict markers,
    per-test timeout): a ``unit/`` and an ``integration/`` folder."""
    pytester.makeconftest(CONFTEST)
    settings = (REPO / "pyproject.toml").read_text().split("[tool.pytest.ini_options]")[1].split("\n[")[0]
    pytester.makepyprojecttoml("[tool.pytest.ini_options]" + settings.replace('testpaths = ["tests"]', ""))
    unit = pytester.mkpydir("unit")
    (unit / "test_scratch.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys, time
            import pytest

            def test_plain():
                assert 1 + 1 == 2

            def test_an_unseen_interpreter():
                subprocess.run([sys.executable, "-c", "pass"])

            @pytest.mark.slow
            def test_marked_by_hand():
                subprocess.run([sys.executable, "-c", "pass"], check=True)

            @pytest.fixture
            def browser():
                yield None

            def test_in_the_browser(browser):
                pass

            @pytest.mark.ddp
            def test_two_processes():
                pass

            @pytest.mark.timeout(1)
            def test_hangs():
                time.sleep(30)
            """
        )
    )
    integration = pytester.mkpydir("integration")
    (integration / "test_command.py").write_text("def test_end_to_end():\n    assert True\n")
    return pytester


def _collected(result: pytest.RunResult) -> set[str]:
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_tiers__the_folder_and_the_markers_decide(suite):
    fast = suite.runpytest_inprocess("-m", "not slow", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert _collected(fast) == {"test_plain", "test_an_unseen_interpreter", "test_hangs"}
    slow = suite.runpytest_inprocess("-m", "slow", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert _collected(slow) == {
        "test_marked_by_hand",
        "test_in_the_browser",
        "test_two_processes",
        "test_end_to_end",
    }
    browser = suite.runpytest_inprocess("-m", "browser", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert _collected(browser) == {"test_in_the_browser"}


def test_tiers__an_unmarked_interpreter_fails_naming_the_fix_and_a_hang_fails_alone(suite):
    result = suite.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    output = result.stdout.str()
    assert "test_an_unseen_interpreter starts a fresh Python interpreter" in output and "run_mae" in output
    assert "tests/integration/" in output
    assert "Timeout" in output and "test_hangs" in output


def test_tiers__every_test_file_is_in_a_tier_folder():
    """No flat test module: a test of ``mae/x/y.py`` is ``tests/unit/x/test_y.py``, an end-to-end one is under
    ``tests/integration/``, a page's under ``tests/docs/``."""
    tests = REPO / "tests"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    assert not flat, f"test modules outside a tier folder: {flat}"
    folders = {p.relative_to(tests).parts[0] for p in tests.rglob("test_*.py")}
    assert folders <= {"unit", "integration", "docs", "gpu", "suite"}, folders


def test_tiers__an_unregistered_marker_is_refused(suite):
    suite.makepyfile(test_typo="import pytest\n\n@pytest.mark.slwo\ndef test_x():\n    pass\n")
    result = suite.runpytest_inprocess("test_typo.py", "-p", "no:cacheprovider")
    assert "'slwo' not found in `markers` configuration option" in result.stdout.str()


@pytest.mark.slow  # starts a process of its own
@pytest.mark.parametrize(
    "command",
    [
        ["stats", "/nonexistent/folder"],  # a project error: exit 2, the message alone
        ["knn", "--no-such-flag"],  # the parser's error
    ],
    ids=["project-error", "parser-error"],
)
def test_forked_command__same_exit_status_and_output_as_a_fresh_interpreter(command):
    forked, fresh = run_mae(*command, check=False), run_mae_process(*command, check=False)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    assert forked.stderr.strip().splitlines()[-1:] == fresh.stderr.strip().splitlines()[-1:]


@pytest.mark.slow  # starts a process of its own
def test_forked_command__the_interpreter_state_of_a_fresh_one(tmp_path):
    """What a command inherits that is not its own code: the start method of its processes (a loader's
    workers started through a forkserver would take seconds each, unlike a user's run), its streams'
    buffering (a test watching stderr sees each line), its arguments and working directory."""
    script = tmp_path / "state.py"
    script.write_text(
        "import multiprocessing, os, sys\n"
        "print(multiprocessing.get_start_method(allow_none=True), sys.stdout.line_buffering,\n"
        "      sys.stderr.line_buffering, sys.argv[1:], os.getcwd())\n"
    )
    forked, fresh = _forked(str(script), "a", "b"), _fresh(str(script), "a", "b")
    assert forked.stdout == fresh.stdout


def test_forked_command__an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import sys\nprint('before', sys.argv[1:])\nraise KeyError('boom')\n")
    result = _forked(str(script), "a")
    assert result.returncode == 1 and result.stdout == "before ['a']\n"
    assert "Traceback" in result.stderr and result.stderr.strip().endswith("KeyError: 'boom'")


def test_forked_command__past_its_time_limit_is_killed_and_raises_as_subprocess_does(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as info:
        _forked(str(script), timeout=1)
    assert info.value.output == "started\n"


def test_forked_command__a_childs_exit_leaves_the_servers_temporary_folders(tmp_path):
    """A folder the server made at import (W&B's media staging folder: timm imports wandb) is the server's:
    the first child to exit must not remove it from under the next one, as it would by running the
    server's exit functions (``TemporaryDirectory`` cleanups) as its own."""
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    script = tmp_path / "media.py"
    script.write_text(
        "import os\n"
        "from wandb.sdk.data_types._private import MEDIA_TMP\n"
        "print(os.path.isdir(MEDIA_TMP.name))\n"
    )
    assert [_forked(str(script)).stdout for _ in range(2)] == ["True\n", "True\n"]


def test_forked_command__started_as_a_background_job_sigint_stays_ignored(tmp_path):
    """``sigint_ignored``: SIGINT ignored, as a fresh interpreter started by ``cmd &`` in a script keeps it;
    otherwise Python's own Ctrl-C handler, as in a terminal."""
    from tests.forked_commands import ForkedProcess

    script = tmp_path / "sigint.py"
    script.write_text(
        "import signal\n"
        "handler = signal.getsignal(signal.SIGINT)\n"
        "print('ignored' if handler == signal.SIG_IGN else handler is signal.default_int_handler)\n"
    )
    handlers = []
    for ignored in (True, False):
        with ForkedProcess([str(script)], REPO, sigint_ignored=ignored) as child:
            handlers.append(child.communicate(timeout=60)[0].strip())
    assert handlers == ["ignored", "True"]
