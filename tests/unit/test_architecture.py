"""The house's drawing (the architecture page's "Layout", from ``docs/hooks/layers.py``), checked on the
source: each layer imports only the layers below it, no two modules import each other through any chain
(lazy imports inside functions included), every module belongs to a layer, ``mae/eval/`` holds only what
measures, and the drawing on the page is the one the table makes."""

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layers_table():
    """``docs/hooks/layers.py``: the one table of layers (lowest first), also drawn on the architecture
    page."""
    spec = importlib.util.spec_from_file_location("docs_layers", REPO / "docs" / "hooks" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYERS_TABLE = _layers_table()
LAYERS = [modules for modules, _ in LAYERS_TABLE.LAYERS]
MEASUREMENT = {"mae.eval", "mae.eval.attentive_probe", "mae.eval.features", "mae.eval.knn", "mae.eval.probe"}


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
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").split(".")[0] == "mae"
            ):
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
                    " -> ".join(path[path.index(dep) :] + [module, dep])
                    if dep in path
                    else f"{module} -> {dep}"
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


def test_layers__every_module_of_the_package_is_in_a_layer():
    prefixes = [prefix for modules in LAYERS for prefix in modules]
    placed = [m for m in _modules() if any(m == p or m.startswith(p + ".") for p in prefixes)]
    assert sorted(placed) == sorted(_modules()), (
        f"modules in no layer: {sorted(set(_modules()) - set(placed))}"
    )


def test_drawing__the_architecture_page_shows_the_layers_table_as_it_is():
    drawing = LAYERS_TABLE.DRAWING
    assert drawing.read_text(encoding="utf-8") == LAYERS_TABLE.svg(), (
        f"{drawing} differs from docs/hooks/layers.py's table: run `python docs/hooks/layers.py`"
    )
    assert "](layers.svg)" in (REPO / "docs" / "architecture.md").read_text()


def test_drawing__a_changed_table_draws_another_picture():
    changed = [*LAYERS_TABLE.LAYERS[:-1], (("mae.cli",), "the commands")]
    assert LAYERS_TABLE.svg(changed) != LAYERS_TABLE.svg()
    assert ">cli</tspan>" in LAYERS_TABLE.svg(changed) and "the commands" in LAYERS_TABLE.svg(changed)
