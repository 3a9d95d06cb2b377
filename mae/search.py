"""``python -m mae.search --index FILE QUERY_IMAGES... --out grid.png`` (see ``mae.cli.search``)."""

from mae.cli import search_main
from mae.command import run_command

if __name__ == "__main__":
    run_command(search_main)
