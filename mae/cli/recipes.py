"""The recipes shipped with the package (``mae/configs/<folder>/<name>.yaml``; the repository's
``configs/`` is the same folder), how ``--config NAME`` finds one, and how any config file is read.

A recipe's file names its one-line purpose on a ``# recipe: ...`` line at its top, and a config that
only changes another names that one on its first line (``# stacks on: base.yaml``:
``mae.training.config_files.config_stack``, which ``mae.cli.lightning.expand_stacked_configs`` runs;
``shown_recipe`` merges the stack into one).
"""

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    if Path(value).is_dir():
        raise ConfigError(
            f"--config {value}: a folder, not a YAML file; give the YAML file of settings (or the name of a "
            "recipe: mae recipes lists them)"
        )
    own = [r.name.split("/")[1] if r.folder == folders[0] else r.name for r in all_recipes(folders)]
    close = difflib.get_close_matches(name, own, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise RecipeNotFound(
        f"--config {value}: no such file, and no recipe of that name{hint} (recipes of this command: "
        f"{', '.join(own)}; mae recipes lists every recipe)"
    )


def recipe_name(path: Path) -> str:
    """The name of a shipped recipe's file, "<folder>/<stem>" (e.g. "pretrain/default"); else the path."""
    resolved = path.resolve()
    return (
        str(resolved.relative_to(RECIPES_DIR).with_suffix(""))
        if resolved.is_relative_to(RECIPES_DIR)
        else str(path)
    )


def shown_recipe(path: Path) -> str:
    """What ``mae recipes --show`` prints of the recipe file ``path``: a comment naming the file, then the
    file; for a recipe that stacks on others, a config that runs on its own: the recipes it stacks on merged
    with it into one (``merge_configs``, its own values winning) under its comments and a line naming
    the recipes it was made from."""
    # mae.training imports torch: only for --show, so that listing the recipes stays quick
    from mae.training.config_files import config_stack, dump_config, merge_configs, read_config

    stack = config_stack(path)
    text = path.read_text(encoding="utf-8").rstrip("\n")
    if len(stack) == 1:
        return f"# {path}\n{text}"
    merged: dict[str, Any] = {}
    for file in stack:
        merged = merge_configs(merged, read_config(file))
    comments = []
    for line in text.splitlines()[1:]:  # its first line names the base, which is merged in
        if not line.startswith("#"):
            break
        comments.append(line)
    made_from = " + ".join(recipe_name(p) for p in stack)
    body = dump_config(merged)
    return "\n".join(
        [
            f"# {path}",
            f"# made from the recipes {made_from}",
            "# (merged into one, later ones winning: it runs on its own)",
            *comments,
            body.rstrip("\n"),
        ]
    )
