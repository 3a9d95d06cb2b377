"""``python -m mae <command> ...``: the ``mae`` command (``mae.cli.main``)."""

from mae.cli.main import console_main

if __name__ == "__main__":
    console_main()
