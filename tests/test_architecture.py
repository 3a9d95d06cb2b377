"""The house's drawing (README, "Layout"), checked on the source: each layer imports only the layers below
it, no two modules import each other through any chain (lazy imports inside functions included), and
``mae/eval/`` holds only what measures."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Lowest first, as README's layout table lists them; a module belongs to the longest prefix it matches.
LAYERS = [
    ("mae.compat", "mae.errors", "mae.io", "mae.command", "mae.command_options"),
    ("mae.models",),
    ("mae.data.decoding",),
    ("mae.data.views",),
    ("mae.data.sources", "mae.data"),
    ("mae.data.tools", "mae.data.shard", "mae.data.stats"),
    ("mae.convert",),
    ("mae.inference",),
    ("mae.eval",),
    ("mae.training",),
    ("mae.dense",),
    ("mae.apps",),
    ("mae.cli", "mae"),  # every command, and the ``mae`` command over them
]
MEASUREMENT = {"mae.eval", "mae.eval.features", "mae.eval.knn", "mae.eval.probe"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (REPO / "mae").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of project modules, wherever they stand in it (``from mae.x import y``
    counts as ``mae.x.y`` when that is a module, else ``mae.x``)."""

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {owner(a.name) for a in node.names if a.name.split(".")[0] == "mae"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "mae":
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else owner(node.module)
                    for a in node.names
                }
        graph[name] = found - {name}
    return graph


def _layer(module: str) -> int:
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1]


def test_layers__every_import_points_down_or_sideways():
    graph = _imports(_modules())
    upward = [
        f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
        for m, deps in sorted(graph.items())
        if m != "mae"
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_layers__no_import_loop_between_modules():
    graph = _imports(_modules())
    loops, state = [], {}

    def visit(module: str, path: list[str]) -> None:  # depth-first; a grey module met again closes a loop
        state[module] = "grey"
        for dep in sorted(graph[module]):
            if state.get(dep) == "grey":
                loops.append(
                    " -> ".join(path[path.index(dep) :] + [module, dep]) if dep in path else f"{module} -> {dep}"
                )
            elif dep not in state:
                visit(dep, path + [module])
        state[module] = "black"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not loops, "import loops:\n" + "\n".join(loops)


def test_eval__holds_only_what_measures():
    extra = sorted(set(m for m in _modules() if m == "mae.eval" or m.startswith("mae.eval.")) - MEASUREMENT)
    assert not extra, (
        f"{extra} in mae/eval/, which holds what measures a trained encoder (features, kNN, probe): an "
        f"application of a trained model goes in mae/apps/, what both share in mae/inference/"
    )
