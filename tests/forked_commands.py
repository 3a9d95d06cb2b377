"""Run an entry point as a forked copy of an interpreter that has already imported the project.

A command-line test pays for importing torch, Lightning and timm (about 6 s on 2 cores) in every
fresh ``mae pretrain ...``. Here one server process (multiprocessing's forkserver, started once a
test session) imports them, runs no torch op, and forks a child per command: the child is a new
process with its own memory, working directory, environment, ``sys.argv``, stdout and stderr, that
runs the script or module as ``__main__`` (``runpy``) and exits with the status Python would give
(0, ``sys.exit``'s code, 1 after an uncaught exception's traceback).

What it is not: the child shares the server's process group, and the server's signal handlers and
hash seed. A test about the process itself (signals to the group, DDP launchers re-running
``sys.argv``, the interpreter's start-up) starts a real one (``run_script(..., fresh_process=True)``).
"""

import atexit
import contextlib
import faulthandler
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from pathlib import Path

# What every entry point imports before its first step; the server imports them once.
PRELOAD = [
    "torch",
    "torchvision",
    "timm",
    "lightning.pytorch",
    "jsonargparse",
    "mae.cli",
    "tests.forked_commands",
]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)

# The signal on which a child writes every thread's stack to its stderr (``faulthandler``): sent to a child
# that is still running when a test's timeout ends, so that the failure shows where it hung.
_DUMP_STACKS = signal.SIGUSR2


class ChildTimeout(subprocess.TimeoutExpired):
    """``subprocess.TimeoutExpired`` whose message ends with the tail of the child's output, its stacks at
    the timeout included."""

    def __str__(self) -> str:
        tail = ((self.stdout or "") + (self.stderr or ""))[-6000:]
        return f"{super().__str__()}; its output, ending with its stacks at the timeout:\n{tail}"


class ForkedProcess:
    """``subprocess.Popen([sys.executable, *command], cwd=cwd, env=env)``, started as a forked child of the
    preloaded server, with stdout and stderr in files: what the tests use of ``Popen`` (``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``), and ``wait_for_output``.

    ``command`` is ``[script path, *args]`` or ``["-m", module, *args]``. ``new_session``: the child leads a
    session and process group of its own (``Popen(start_new_session=True)``, as a scheduler starts a job),
    so ``os.killpg(pid, ...)`` signals it and the processes it starts. ``sigint_ignored``: it starts with
    SIGINT ignored, as a script's background job (``cmd &``) starts, which a fresh interpreter leaves
    ignored. Closing it (or leaving its ``with`` block, also when the test is interrupted) kills a child
    still running: no orphan is left.
    """

    def __init__(
        self,
        command: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        new_session: bool = False,
        sigint_ignored: bool = False,
    ) -> None:
        self.args = [sys.executable, *command]
        self._folder = tempfile.TemporaryDirectory(prefix="forked-command-")
        self._out, self._err = Path(self._folder.name) / "stdout", Path(self._folder.name) / "stderr"
        environment = dict(os.environ if env is None else env)
        child_args = (
            command,
            str(cwd),
            environment,
            str(self._out),
            str(self._err),
            new_session,
            sigint_ignored,
        )
        self._child = _context.Process(target=_child_main, args=child_args)
        self._child.start()
        self.pid = self._child.pid

    @property
    def returncode(self) -> int | None:
        """The exit status; minus the signal's number when a signal ended it, as ``Popen``'s."""
        return self._child.exitcode

    def poll(self) -> int | None:
        return self._child.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status. Raises ``subprocess.TimeoutExpired`` when the child still runs after
        ``timeout``."""
        self._child.join(timeout)
        if self._child.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, _DUMP_STACKS)
            self._child.join(1.0)  # the stacks written
            raise ChildTimeout(self.args, timeout, self.stdout(), self.stderr())
        return self._child.exitcode

    def send_signal(self, signum: int) -> None:
        """Signal the child; nothing when it has already ended (as ``Popen``)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended since
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self._child.kill()

    def stdout(self) -> str:
        return _read(self._out)

    def stderr(self) -> str:
        return _read(self._err)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once the child has ended (``wait``)."""
        self.wait(timeout)
        return self.stdout(), self.stderr()

    def wait_for_output(self, text: str, timeout: float) -> str:
        """The first whole line of the child's stdout or stderr that holds ``text``, once it is written.

        Raises:
            AssertionError: the child ended, or ``timeout`` seconds passed, before it printed ``text``.
        """
        deadline = time.monotonic() + timeout
        while True:
            for stream in (self.stdout(), self.stderr()):
                found = next((line for line in stream.splitlines(keepends=True) if text in line), None)
                if found is not None and found.endswith("\n"):
                    return found.rstrip("\n")
            if self.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{' '.join(self.args)} did not print {text!r} (exit status {self.poll()}):\n"
                    f"{(self.stdout() + self.stderr())[-3000:]}"
                )
            time.sleep(0.01)

    def close(self) -> None:
        if self._child.exitcode is None:
            self._child.kill()
        self._child.join()
        self._folder.cleanup()

    def __enter__(self) -> "ForkedProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_forked(
    command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True,
    timeout=timeout, env=env)``, run in a forked child of the preloaded server (``ForkedProcess``).

    ``command`` is ``[script path, *args]`` or ``["-m", module, *args]``. Raises
    ``subprocess.TimeoutExpired`` (after killing the child) as ``subprocess.run`` does.
    """
    with ForkedProcess(
        command, cwd, env
    ) as child:  # killed on the way out, also when the test is interrupted
        code = child.wait(timeout)
        return subprocess.CompletedProcess(child.args, code, child.stdout(), child.stderr())


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _child_main(
    command: list[str],
    cwd: str,
    env: dict[str, str],
    out: str,
    err: str,
    new_session: bool,
    sigint_ignored: bool = False,
) -> None:
    """The child: the interpreter state a fresh ``python <command>`` would have, then the command."""
    if new_session:
        os.setsid()
    # Ctrl-C as a terminal's command has it, not as the suite's runner does (a script's background job, as
    # `cmd &` in a script starts one, ignores SIGINT, and its children inherit that: ``sigint_ignored``).
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    # A forkserver's child inherits "forkserver" as its start method; a fresh interpreter has none set (Linux:
    # fork). Without this, the command's loader workers would start through a new forkserver of their own:
    # ~9 s, and unlike a user's run.
    multiprocessing.set_start_method(None, force=True)
    _redirect(1, out)
    _redirect(2, err)
    faulthandler.register(_DUMP_STACKS, file=2, all_threads=True)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))  # as the interpreter reads its environment at start-up
    sys.stdout = _text_stream(1, unbuffered, line_buffering=False)
    sys.stderr = _text_stream(
        2, unbuffered, line_buffering=not unbuffered
    )  # Python 3.9+: stderr line-buffered
    sys.stdin = open(os.devnull)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the parent's cached temporary folder: a fresh interpreter reads TMPDIR anew
    _leave_the_servers_objects_at_exit()
    code = 0
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]  # runpy puts the module's file in argv[0]
            sys.modules.pop(
                command[1], None
            )  # a fresh `python -m` runs it as __main__ only, not imported too
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(command)
            sys.path[0:0] = [
                str(Path(command[0]).resolve().parent)
            ]  # as python <script> puts its folder first
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


def _leave_the_servers_objects_at_exit() -> None:
    """What the server made before the fork is the server's, shared by every child: the child's exit
    (``atexit._run_exitfuncs`` below) must not finalise it. A fresh interpreter makes its own at import and
    removes it at exit; a forked child that did would take it from the server and the children after it
    (W&B's media staging folder, a ``tempfile.TemporaryDirectory`` made when timm imports wandb: the second
    run's figures found it gone). The child's own objects and exit functions still run."""
    for finalizer in list(weakref.finalize._registry):
        found = finalizer.peek()
        finalizer.atexit = False
        if found is not None and isinstance(found[0], tempfile.TemporaryDirectory):
            atexit.unregister(found[0].cleanup)  # also registered by hand (wandb: `atexit.register(...)`)


def _text_stream(fd: int, unbuffered: bool, line_buffering: bool) -> io.TextIOWrapper:
    """A standard stream over ``fd`` as the interpreter makes it: unbuffered and written through with
    ``PYTHONUNBUFFERED``, else buffered (stdout) or line-buffered (stderr)."""
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        binary,
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=line_buffering,
        write_through=unbuffered,
    )


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
