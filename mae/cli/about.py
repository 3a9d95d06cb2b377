"""``mae recipes``, ``mae env``, ``mae version`` and ``mae completion``: what the package holds, what a bug
report needs, and shell completion."""

from importlib import metadata
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run
from mae.cli.commands import BY_NAME, COMMANDS
from mae.cli.recipes import RECIPES_DIR, RecipeNotFound, all_recipes, resolve_config, shown_recipe
from mae.errors import ConfigError, UsageError

DISTRIBUTION = "mae-lightning"  # the name pip knows the package by (pyproject.toml)


def installed_version() -> str:
    """The installed distribution's version (the source tree's ``mae.__version__`` when not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import mae

        return mae.__version__


# ---------------------------------------------------------------------------------------------- recipes


def recipes_parser() -> ArgumentParser:
    parser = command_parser(
        "mae recipes",
        "The recipes shipped with the package: give a name to --config of the "
        "command shown (a path to your own YAML works the same).",
    )
    parser.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="list only this folder (pretrain, finetune, linprobe, detect, segment)",
    )
    parser.add_argument(
        "--show",
        default=None,
        metavar="NAME",
        help="print the recipe NAME (e.g. pretrain/default), to copy and edit",
    )
    return parser


def run_recipes(args: Namespace) -> list[str]:
    """Print the recipes (or one recipe's text); returns the lines printed."""
    if args.show is not None:
        try:
            path = Path(resolve_config(args.show, tuple(c.recipes[0] for c in COMMANDS if c.recipes)))
        except RecipeNotFound as err:
            raise UsageError(str(err).replace("--config", "--show", 1)) from None
        lines = [shown_recipe(path)]  # a recipe stacked on others: merged with them, to run on its own
        print("\n".join(lines))
        return lines
    recipes = all_recipes(None if args.folder is None else (args.folder,))
    if not recipes:
        folders = sorted({r.folder for r in all_recipes()})
        raise UsageError(f"no recipe folder {args.folder!r}; the folders are {', '.join(folders)}")
    lines = []
    width = max(len(r.name.split("/")[1]) for r in recipes) + 2
    for folder in dict.fromkeys(r.folder for r in recipes):
        users = [c.name for c in COMMANDS if folder in c.recipes]
        if len(users) > 1:  # stacked on another command's recipe (loggers/)
            lines.append(f"{folder} (stacked: mae {'|'.join(users)} --config RECIPE --config {folder}/NAME):")
        else:
            own = BY_NAME[users[0]].recipes[0] == folder
            lines.append(f"{folder} (mae {users[0]} --config {'NAME' if own else folder + '/NAME'}):")
        for recipe in (r for r in recipes if r.folder == folder):
            lines.append(f"  {recipe.name.split('/')[1]:<{width}}{recipe.summary}")
        lines.append("")
    lines.append(
        f"Files: {RECIPES_DIR} (mae recipes --show NAME prints one). A recipe that stacks on another is "
        "run on top of it; give several --config to stack your own."
    )
    print("\n".join(lines))
    return lines


def recipes_main(argv: list[str] | None = None) -> list[str]:
    return parse_and_run(recipes_parser(), run_recipes, argv)


# -------------------------------------------------------------------------------------------------- env


def env_parser() -> ArgumentParser:
    return command_parser(
        "mae env",
        "What a bug report needs: versions, the device, bf16 support, and the "
        "precision and attention kernel a training run would pick by default.",
    )


def run_env(args: Namespace) -> dict[str, str]:
    import mae
    from mae.training.environment import environment  # torch: only for this command

    info = {DISTRIBUTION: f"{installed_version()} ({Path(mae.__file__).parent})", **environment()}
    width = max(map(len, info)) + 2
    print("\n".join(f"{label + ':':<{width}}{value}" for label, value in info.items()))
    return info


def env_main(argv: list[str] | None = None) -> dict[str, str]:
    return parse_and_run(env_parser(), run_env, argv)


# ---------------------------------------------------------------------------------------------- version


def version_parser() -> ArgumentParser:
    return command_parser("mae version", "The installed version of the package.")


def run_version(args: Namespace) -> str:
    line = f"{DISTRIBUTION} {installed_version()}"
    print(line)
    return line


def version_main(argv: list[str] | None = None) -> str:
    return parse_and_run(version_parser(), run_version, argv)


# ------------------------------------------------------------------------------------------- completion

SHELLS = ("bash", "zsh")


def completion_parser() -> ArgumentParser:
    parser = command_parser(
        "mae completion",
        "A completion script for mae, built from every command's parser (every option, Lightning's included: "
        "about a minute to write, so write it once to a file). bash: mae completion bash > "
        "~/.local/share/bash-completion/completions/mae (bash-completion loads it at the first TAB); zsh: "
        "mae completion zsh > ~/.zfunc/_mae, with fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc.",
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell")
    return parser


def mae_parser(names: tuple[str, ...] | None = None) -> ArgumentParser:
    """Every command's parser (or those ``names``) under one ``mae`` parser (imports every command: a few
    seconds)."""
    parser = ArgumentParser(
        prog="mae", description="Masked Autoencoders: pretraining and reuse of the encoder."
    )
    subcommands = parser.add_subcommands(required=True, dest="command")
    for command in (c for c in COMMANDS if names is None or c.name in names):
        subcommands.add_subcommand(command.name, command.build_parser(), help=command.summary)
    return parser


def run_completion(args: Namespace) -> str:
    try:
        import shtab  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"shell completion needs shtab: pip install shtab ({err})") from None
    script = mae_parser().get_completion_script(f"shtab-{args.shell}")
    print(script)
    return script


def completion_main(argv: list[str] | None = None) -> str:
    return parse_and_run(completion_parser(), run_completion, argv)
