"""Nothing executes from a file: every call under ``mae/`` that could run code named by its input (unpickling,
``torch.load``, importing a module by name, evaluating text) is found by walking the syntax trees, and each
must have one of the safe forms below. A rule, not a list of files: a new call anywhere is checked.

The safe forms:

- ``torch.load`` only with ``weights_only=True`` written as the literal; any call taking ``weights_only``
  (Lightning's ``load_from_checkpoint`` and ``load_checkpoint`` included) passes the literal ``True`` or
  hands on unchanged the ``weights_only`` parameter of the function it is in (whose callers this rule
  checks in turn); ``load_from_checkpoint`` always says it. A writer's ``weights_only`` (Lightning's
  ``save_checkpoint``: the weights alone, or the full checkpoint) says what is written, and is not checked.
- Unpickling only through a ``pickle.Unpickler`` subclass that overrides ``find_class`` and refuses there
  (raises) what it does not allow; never ``pickle.load`` / ``loads`` / a plain ``Unpickler``, nor the other
  libraries that unpickle (``dill``, ``joblib``, ``shelve``, ``marshal``), ``numpy.load`` with
  ``allow_pickle=True``, ``yaml.load``; never ``eval`` / ``exec``.
- ``importlib.import_module`` and ``__import__`` only of a module named by a string literal, by an item of a
  module-level table of string literals (a loop over a tuple or list of them, a lookup in a dict of them),
  or by a field of a dataclass of the module that every construction of it under ``mae/`` fills with a
  string literal; or one of the few imports reviewed by hand (``REVIEWED_IMPORTS``, each with why).
"""

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mae"

NEVER = {  # callables that run code named by their input, whatever they are given
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "_pickle.load",
    "_pickle.loads",
    "_pickle.Unpickler",
    "dill.load",
    "dill.loads",
    "joblib.load",
    "shelve.open",
    "marshal.load",
    "marshal.loads",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "torch.jit.load",
    "eval",
    "exec",
}
IMPORTERS = {"importlib.import_module", "__import__"}
UNPICKLER_BASES = {"pickle.Unpickler", "_pickle.Unpickler"}

# Imports whose module name the syntax tree cannot trace to literals, each reviewed, with why no file's
# text chooses the module. (file under mae/, function): why.
REVIEWED_IMPORTS = {
    ("training/trackers/base.py", "logger_type"): (
        "the class path of the config's tracker key (or a registered tracker's logger_class): jsonargparse "
        "imported it while parsing the user's config, as a subclass of Lightning's Logger (LightningCLI "
        "builds every class_path of a config: a config is the user's program, not data)"
    ),
    ("convert/families.py", "call"): (
        "the loader modules of MODEL_FAMILIES' rows, literals passed to _later (imported at the first call "
        "because they sit above the readers), never a file's text"
    ),
    ("cli/moved_classes.py", "new_class_path"): (
        "the new modules of mae.training.settings.MOVES (a table of literals, followed by present_modules), "
        "never the config's text"
    ),
}


@dataclass(frozen=True)
class Module:
    path: Path
    tree: ast.Module
    aliases: dict[str, str]  # local name -> the dotted name it was imported as

    @property
    def name(self) -> str:
        return self.path.relative_to(PACKAGE).as_posix()


def _aliases(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


@cache
def modules() -> tuple[Module, ...]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child.parent = node  # type: ignore[attr-defined]
        found.append(Module(path, tree, _aliases(tree)))
    return tuple(found)


def dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name ``node`` (a name or an attribute chain) stands for, its first part resolved through the
    module's imports (``np.load`` -> ``numpy.load``); None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _enclosing(node: ast.AST, kind: type | tuple[type, ...]) -> ast.AST | None:
    while (node := getattr(node, "parent", None)) is not None:
        if isinstance(node, kind):
            return node
    return None


# Calls whose weights_only says what is written (the weights alone, or the full checkpoint), not what a
# load may build: Lightning's save_checkpoint.
WRITERS = ("save_checkpoint",)


def _writes(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in WRITERS


def _passed_through(value: ast.expr, call: ast.Call) -> bool:
    """``value`` is the ``weights_only`` parameter of the function the call is in, handed on unchanged."""
    function = _enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
    if not isinstance(value, ast.Name) or value.id != "weights_only" or function is None:
        return False
    arguments = function.args  # type: ignore[attr-defined]
    names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    assigned = any(
        isinstance(n, ast.Name) and n.id == "weights_only" and isinstance(n.ctx, ast.Store)
        for n in ast.walk(function)
    )
    return "weights_only" in names and not assigned


def _module_level_value(module: Module, name: str) -> ast.expr | None:
    for node in module.tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return node.value
    return None


def _all_strings(nodes: list[ast.expr | None]) -> bool:
    return bool(nodes) and all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in nodes)


def _string_table(module: Module, node: ast.expr) -> bool:
    """``node`` is a tuple, list or set of string literals, or a module-level name bound to one."""
    if isinstance(node, ast.Name):
        node = _module_level_value(module, node.id)
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and _all_strings(list(node.elts))


def _string_dict(module: Module, node: ast.expr) -> bool:
    """``node`` is a module-level name bound to a dict whose values are string literals."""
    value = _module_level_value(module, node.id) if isinstance(node, ast.Name) else None
    return isinstance(value, ast.Dict) and _all_strings(list(value.values))


def _loop_over_table(module: Module, name: ast.Name) -> bool:
    """``name`` is the target of a ``for`` loop (or comprehension) over a table of string literals."""
    node: ast.AST = name
    while (node := getattr(node, "parent", None)) is not None:
        loops = (
            [node]
            if isinstance(node, ast.For)
            else node.generators
            if isinstance(
                node, ast.comprehension | ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
            )
            else []
        )
        for loop in loops:
            if isinstance(loop.target, ast.Name) and loop.target.id == name.id:
                return _string_table(module, loop.iter)
    return False


def _dataclass_field_of_literals(module: Module, node: ast.Attribute) -> bool:
    """``node`` is ``self.<field>`` in a dataclass of ``module`` that every construction under ``mae/`` fills
    with a string literal for that field (by keyword, or by position among the class's fields)."""
    cls = _enclosing(node, ast.ClassDef)
    if not (isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(cls, ast.ClassDef)):
        return False
    if not any(
        dotted(d.func if isinstance(d, ast.Call) else d, module.aliases)
        in ("dataclass", "dataclasses.dataclass")
        for d in cls.decorator_list
    ):
        return False
    fields = [
        s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]
    if node.attr not in fields:
        return False
    position = fields.index(node.attr)
    constructions = [
        call
        for other in modules()
        for call in ast.walk(other.tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == cls.name
    ]
    given = [
        _keyword(call, node.attr) or (call.args[position] if len(call.args) > position else None)
        for call in constructions
    ]
    return _all_strings(given)


def _imports_from_a_table(module: Module, call: ast.Call) -> bool:
    if not call.args:
        return False
    argument = call.args[0]
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return True
    if isinstance(argument, ast.Name):
        return _loop_over_table(module, argument)
    if isinstance(argument, ast.Subscript):
        return _string_dict(module, argument.value)
    if isinstance(argument, ast.Attribute):
        return _dataclass_field_of_literals(module, argument)
    return False


def _reviewed_import(module: Module, call: ast.Call) -> bool:
    function = _enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
    return function is not None and (module.name, function.name) in REVIEWED_IMPORTS  # type: ignore[attr-defined]


def _unpickler_classes(module: Module) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ClassDef)
        and any(dotted(b, module.aliases) in UNPICKLER_BASES for b in node.bases)
    }


def _refuses_in_find_class(cls: ast.ClassDef) -> bool:
    find_class = next(
        (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "find_class"), None
    )
    return find_class is not None and any(isinstance(n, ast.Raise) for n in ast.walk(find_class))


def _allows_pickles(call: ast.Call) -> bool:
    allow = _keyword(call, "allow_pickle")
    return allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False)


def violations(module: Module) -> Iterator[str]:
    """Every call of ``module`` that could run code named by its input and has none of the safe forms."""
    for name, cls in _unpickler_classes(module).items():
        if not _refuses_in_find_class(cls):
            yield (
                f"{module.name}:{cls.lineno}: {name} unpickles without a find_class that refuses what it "
                "does not allow"
            )
    for call in ast.walk(module.tree):
        if not isinstance(call, ast.Call):
            continue
        where = f"{module.name}:{call.lineno}"
        name = dotted(call.func, module.aliases) or ""
        weights_only = _keyword(call, "weights_only")
        if name in NEVER:
            yield f"{where}: {name}(...) runs code named by what it reads"
        elif name == "torch.load" and not _is_true(weights_only):
            yield f"{where}: torch.load without weights_only=True"
        elif name == "numpy.load" and _allows_pickles(call):
            yield f"{where}: numpy.load with allow_pickle not the literal False"
        elif name in IMPORTERS and not (
            _imports_from_a_table(module, call) or _reviewed_import(module, call)
        ):
            yield f"{where}: {name}(...) of a module named by a value that is not a literal or a table's"
        elif (
            weights_only is not None
            and not _writes(call)
            and not (_is_true(weights_only) or _passed_through(weights_only, call))
        ):
            yield f"{where}: {name or 'a call'}(weights_only=...) not True"
        elif (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "load_from_checkpoint"
            and weights_only is None
        ):
            yield f"{where}: load_from_checkpoint without weights_only=True"


def test_safe_loading__every_call_that_could_run_code_from_a_file_has_a_safe_form():
    found = [v for module in modules() for v in violations(module)]
    assert not found, "\n".join(found)


def test_safe_loading__the_rule_sees_the_calls_it_allows():
    """The walk reaches the safe loaders (so a rule that found nothing is not a rule that looked nowhere)."""
    seen = {
        dotted(call.func, module.aliases)
        for module in modules()
        for call in ast.walk(module.tree)
        if isinstance(call, ast.Call)
    }
    assert {"torch.load", "importlib.import_module"} <= seen
    assert any(_unpickler_classes(module) for module in modules())
    for file, function in REVIEWED_IMPORTS:  # each exception still names an import there
        module = next(m for m in modules() if m.name == file)
        assert any(
            isinstance(call, ast.Call)
            and dotted(call.func, module.aliases) in IMPORTERS
            and getattr(_enclosing(call, ast.FunctionDef), "name", None) == function
            for call in ast.walk(module.tree)
        ), (file, function)


UNSAFE = {
    "torch.load without weights_only": "import torch\ntorch.load(path)\n",
    "torch.load with weights_only=False": "import torch\ntorch.load(path, weights_only=False)\n",
    "load_from_checkpoint with weights_only=False": "M.load_from_checkpoint(p, weights_only=False)\n",
    "load_from_checkpoint leaving it to the default": "M.load_from_checkpoint(p)\n",
    "a weights_only computed": (
        "def f(weights_only):\n    weights_only = not weights_only\n    g(p, weights_only=weights_only)\n"
    ),
    "pickle.load": "import pickle\npickle.load(f)\n",
    "pickle.loads through an alias": "import pickle as p\np.loads(b)\n",
    "a plain Unpickler": "from pickle import Unpickler\nUnpickler(f).load()\n",
    "an Unpickler subclass that refuses nothing": "import pickle\nclass U(pickle.Unpickler):\n    pass\n",
    "numpy.load allowing pickles": "import numpy as np\nnp.load(p, allow_pickle=True)\n",
    "eval": "eval(text)\n",
    "import_module of a file's text": (
        "from importlib import import_module\nimport_module(record['module'])\n"
    ),
    "import_module of a split string": (
        "import importlib\nm, _, n = s.rpartition('.')\nimportlib.import_module(m)\n"
    ),
    "__import__ of a parameter": "def f(name):\n    __import__(name)\n",
}
SAFE = {
    "torch.load with weights_only=True": "import torch\ntorch.load(path, weights_only=True)\n",
    "a weights_only handed on": "def f(p, weights_only=None):\n    g(p, weights_only=weights_only)\n",
    "a full checkpoint written": "trainer.save_checkpoint(path, weights_only=False)\n",
    "a refusing Unpickler": (
        "import pickle\nclass U(pickle.Unpickler):\n    def find_class(self, m, n):\n"
        "        raise pickle.UnpicklingError(m)\nU(f).load()\n"
    ),
    "import_module of a literal": "import importlib\nimportlib.import_module('json')\n",
    "import_module over a table": (
        "import importlib\nNAMES = ('a', 'b')\nfor n in NAMES:\n    importlib.import_module(n)\n"
    ),
    "import_module from a dict of literals": (
        "import importlib\nT = {'x': 'a.b'}\nimportlib.import_module(T[k])\n"
    ),
}


def _check(source: str) -> list[str]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    return list(violations(Module(PACKAGE / "example.py", tree, _aliases(tree))))


@pytest.mark.parametrize("case", list(UNSAFE))
def test_safe_loading__an_unsafe_form_is_found(case):
    assert _check(UNSAFE[case]), case


@pytest.mark.parametrize("case", list(SAFE))
def test_safe_loading__a_safe_form_is_allowed(case):
    assert _check(SAFE[case]) == [], case
