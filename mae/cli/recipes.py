"""The recipes shipped with the package (``mae/configs/<folder>/<name>.yaml``; the repository's
``configs/`` is the same folder) and how ``--config NAME`` finds one.

A recipe's file names its one-line purpose on a ``# recipe: ...`` line at its top, and a recipe that
only changes another names that one on its first line (``# stacks on: base.yaml``, read by
``mae.cli.lightning.expand_stacked_configs``).
"""

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from mae.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "configs"
_SUMMARY = re.compile(r"^# recipe: (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Recipe:
    """``name``: "<folder>/<stem>" (e.g. "pretrain/default"); ``path``: its YAML file."""

    name: str
    path: Path

    @property
    def summary(self) -> str:
        match = _SUMMARY.search(self.path.read_text(encoding="utf-8"))
        return match.group(1).strip() if match else ""

    @property
    def folder(self) -> str:
        return self.name.split("/")[0]


def all_recipes(folders: tuple[str, ...] | None = None) -> list[Recipe]:
    """Every recipe (or those in ``folders``), sorted by folder, then name."""
    found = [Recipe(f"{p.parent.name}/{p.stem}", p) for p in sorted(RECIPES_DIR.glob("*/*.yaml"))]
    return [r for r in found if folders is None or r.folder in folders]


class RecipeNotFound(ConfigError):
    """``--config`` named neither a file nor a recipe."""


def resolve_config(value: str, folders: tuple[str, ...]) -> str:
    """The file ``--config value`` means: ``value`` itself when it is a file (a path always wins), else
    the recipe it names: "default" is looked up in ``folders`` in order (a command's own recipes), and
    "<folder>/<name>" (e.g. "linprobe/default") in that folder; ".yaml" may be left out.

    Raises:
        RecipeNotFound: neither a file nor a recipe, naming the recipes ``folders`` hold.
    """
    if Path(value).is_file():
        return value
    name = value.removesuffix(".yaml")
    candidates = [RECIPES_DIR / f"{name}.yaml"] if "/" in name else []
    candidates += [RECIPES_DIR / folder / f"{name}.yaml" for folder in folders]
    for path in candidates:
        if path.is_file() and path.resolve().is_relative_to(RECIPES_DIR):
            return str(path)
    own = [r.name.split("/")[1] if r.folder == folders[0] else r.name for r in all_recipes(folders)]
    close = difflib.get_close_matches(name, own, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise RecipeNotFound(
        f"--config {value}: no such file, and no recipe of that name{hint} (recipes of this command: "
        f"{', '.join(own)}; mae recipes lists every recipe)"
    )
