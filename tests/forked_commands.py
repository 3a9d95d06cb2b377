"""Run an entry point as a forked copy of an interpreter that has already imported the project.

A command-line test pays for importing torch, Lightning and timm (about 6 s on 2 cores) in every
fresh ``python train.py ...``. Here one server process (multiprocessing's forkserver, started once a
test session) imports them, runs no torch op, and forks a child per command: the child is a new
process with its own memory, working directory, environment, ``sys.argv``, stdout and stderr, that
runs the script or module as ``__main__`` (``runpy``) and exits with the status Python would give
(0, ``sys.exit``'s code, 1 after an uncaught exception's traceback).

What it is not: the child shares the server's process group, and the server's signal handlers and
hash seed. A test about the process itself (signals to the group, DDP launchers re-running
``sys.argv``, the interpreter's start-up) starts a real one (``run_script(..., fresh_process=True)``).
"""

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# What every entry point imports before its first step; the server imports them once.
PRELOAD = ["torch", "torchvision", "timm", "lightning.pytorch", "jsonargparse", "mae.cli", "tests.forked_commands"]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def run_forked(
    command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True,
    timeout=timeout, env=env)``, run in a forked child of the preloaded server.

    ``command`` is ``[script path, *args]`` or ``["-m", module, *args]``. Raises
    ``subprocess.TimeoutExpired`` (after killing the child) as ``subprocess.run`` does.
    """
    with tempfile.TemporaryDirectory(prefix="forked-command-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        environment = dict(os.environ if env is None else env)
        child = _context.Process(target=_child_main, args=(command, str(cwd), environment, str(out), str(err)))
        child.start()
        timed_out = True
        try:
            child.join(timeout)
            timed_out = child.exitcode is None
        finally:  # also when the test itself is interrupted (pytest-timeout, Ctrl-C): no orphan keeps running
            if child.exitcode is None:
                child.kill()
                child.join()
        if timed_out:
            raise subprocess.TimeoutExpired([sys.executable, *command], timeout, _read(out), _read(err))
        return subprocess.CompletedProcess(
            [sys.executable, *command], child.exitcode, _read(out), _read(err)
        )  # fmt: skip


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _child_main(command: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The child: the interpreter state a fresh ``python <command>`` would have, then the command."""
    _redirect(1, out)
    _redirect(2, err)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]  # runpy puts the module's file in argv[0]
            sys.modules.pop(command[1], None)  # a fresh `python -m` runs it as __main__ only, not imported too
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(command)
            sys.path[0:0] = [str(Path(command[0]).resolve().parent)]  # as python <script> puts its folder first
            runpy.run_path(command[0], run_name="__main__")
    except SystemExit as exit_:
        code = _exit_status(exit_.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # a forked multiprocessing child skips them; a real interpreter runs them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _redirect(fd: int, path: str) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)
