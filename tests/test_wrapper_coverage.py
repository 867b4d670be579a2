"""The Python package wraps every native method, and exports what it lists.

Modelled on datafusion-python's ``test_wrapper_coverage.py``, which checks
that every name of its PyO3 module appears in the Python wrappers. Here the
wrappers rename (``Dataset.version`` reads the native ``snapshot``,
``Dataset.get_item`` calls ``get``), so the check is on use instead: the
sources of ``python/datasetrt/`` are parsed, every attribute read on a native
object is collected, and each public member of each native class (and each
name of the native module) must be among them. A native method that no
wrapper calls fails here unless it is listed in :data:`NOT_WRAPPED` with the
reason.

What counts as a native object (parsed, not imported):

- ``_native.<Class>(...)``, and a local name assigned from it (``writer``)
  or annotated as one (``engine: _native.Dataset = ...``); a static method
  read on the class (``_native.Batch.from_ipc``);
- ``self._native`` inside a wrapper class that assigns ``self._native``: the
  type of that assignment, a native class or the stub's return type of the
  native method called (``dataset._native.start(...)`` is a ``Loader``);
- ``<name>._native`` elsewhere, where ``<name>`` (or ``<obj>.<name>``) is the
  wrapper class's name in lower case (``dataset._native``,
  ``self.dataset._native``).

Any other ``._native`` read fails the test, so a new way of reaching a native
object must be taught here rather than silently ignored.
"""

from __future__ import annotations

import ast
from pathlib import Path

import datasetrt
from datasetrt import _native
from datasetrt.worker import distributed_module

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "datasetrt"

#: Protocol methods checked like public ones, where a native class defines them.
PROTOCOL = (
    "__len__",
    "__iter__",
    "__next__",
    "__arrow_c_stream__",
    "__datafusion_table_provider__",
)

#: (native class, or "" for the module; member) -> why no wrapper uses it.
NOT_WRAPPED: dict[tuple[str, str], str] = {
    ("Dataset", "snapshots"): (
        "the wrapper offers Dataset.history(), one row per snapshot on disk with its "
        "details, instead of the bare list of numbers"
    ),
    ("Dataset", "snapshot_dir"): (
        "the wrapper keeps the snapshot_dir argument it was given (it pickles by recipe) "
        "and does not expose the resolved directory"
    ),
    ("Loader", "__iter__"): "the wrapper calls next() on the native loader directly",
    ("TableProvider", "__datafusion_table_provider__"): (
        "called by the datafusion package on what Dataset.datafusion_table() returns"
    ),
    ("", "publish_remote"): (
        "the uploader of any local cache directory, kept for the test that it refuses a "
        "cache with holes; build() uploads what it staged through publish_staged"
    ),
    ("", "PAYLOAD_COLUMNS"): (
        "the columns of the SQL table `payloads`, documented for users; no wrapper needs them"
    ),
}


#: Native classes handed to users as they are (``Loader.plan`` is a
#: ``DrawPlan``, ``Loader.spec`` a ``LoaderSpec``): their members are the
#: API, documented in the stub.
EXPOSED = {"DrawPlan", "LoaderSpec"}

#: Native members the wrappers use to build something of another shape, so
#: no wrapper offers them under their own name.
INTERNAL: dict[tuple[str, str], str] = {
    ("Dataset", "plan"): (
        "TorchDataset and the Ray source plan their draws from a LoaderSpec with it; users "
        "see the plan as Loader.plan"
    ),
    ("Dataset", "start"): "Loader starts its native loader from its LoaderSpec with it",
    ("Dataset", "pin"): "unpickling pins the snapshot the pickled Dataset had active",
    ("Dataset", "prepare_draws"): (
        "TorchDataset makes the head's alias tables with it before a DataLoader forks"
    ),
    ("Batch", "payload_head"): "Batch.typed reads the first bytes of row 0 with it",
    ("Batch", "payload_layout"): "records.Reader reads a row's typed-record layout with it",
    ("Batch", "first_unlike"): (
        "records.Reader checks that every record of a batch has one header with it"
    ),
    ("Batch", "gather_into"): (
        "Batch.tensor/torch copy a field of every record into one array with it"
    ),
    ("Batch", "run"): "Batch.tensor views a field in place when the records lie evenly",
    ("Batch", "to_ipc"): "a pickled Batch carries the engine's batch and its metadata as Arrow IPC",
    ("Batch", "from_ipc"): "an unpickled Batch is a native batch again, made with it",
}


def native_classes() -> dict[str, type]:
    classes = {n: c for n, c in vars(_native).items() if isinstance(c, type)}
    # the companion module (this extension built with SQL on workers) adds one
    classes["Worker"] = distributed_module().Worker
    return classes


def native_members() -> set[tuple[str, str]]:
    """Every (class, member) and ("", module name) the wrapper layer should use."""
    members = set()
    for name, cls in native_classes().items():
        if name in EXPOSED:
            continue
        members |= {(name, m) for m in vars(cls) if not m.startswith("_") or m in PROTOCOL}
    members |= {
        ("", n)
        for n, v in vars(_native).items()
        if not isinstance(v, type) and (not n.startswith("_") or n == "__version__")
    }
    return members


def stub_returns() -> dict[tuple[str, str], str]:
    """(native class, method) -> the native class the stub says it returns."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    out = {}
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef):
            for item in cls.body:
                if (
                    isinstance(item, ast.FunctionDef)
                    and isinstance(item.returns, ast.Name)
                    and isinstance(getattr(_native, item.returns.id, None), type)
                ):
                    out[cls.name, item.name] = item.returns.id
    return out


class Uses(ast.NodeVisitor):
    """Collects the native members one wrapper module reads."""

    def __init__(self, path: Path, wrapped: dict[str, str], returns: dict[tuple[str, str], str]):
        self.path = path
        # the level of a relative import of the package itself: 1 in its own
        # modules, 2 in a subpackage's (``from .. import _native`` in sources/)
        self.top = len(path.relative_to(PACKAGE).parts)
        self.wrapped = wrapped  # wrapper class -> native class of its self._native
        self.returns = returns
        self.classes = set(native_classes())
        self.module_aliases: set[str] = set()  # names bound to the _native module
        self.cls: str | None = None
        self.locals: dict[str, str] = {}
        self.used: set[tuple[str, str]] = set()
        self.unknown: set[str] = set()

    # -- what a native expression is -------------------------------------------
    def native_type(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.locals.get(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if isinstance(func.value, ast.Name) and func.value.id in self.module_aliases:
                return func.attr if func.attr in self.classes else None
            owner = self.native_type(func.value)
            return None if owner is None else self.returns.get((owner, func.attr))
        if isinstance(node, ast.Attribute) and node.attr == "_native":
            holder = node.value
            if isinstance(holder, ast.Name) and holder.id == "self" and self.cls in self.wrapped:
                return self.wrapped[self.cls]
            name = holder.id if isinstance(holder, ast.Name) else getattr(holder, "attr", None)
            for wrapper, native in self.wrapped.items():
                if name == wrapper.lower():
                    return native
            self.unknown.add(f"{self.path.name}:{node.lineno}: {ast.unparse(node)}")
        return None

    def annotated(self, annotation: ast.AST | None) -> str | None:
        """The native class an annotation ``_native.X`` names, if any."""
        if (
            isinstance(annotation, ast.Attribute)
            and isinstance(annotation.value, ast.Name)
            and annotation.value.id in self.module_aliases
        ):
            return annotation.attr
        return None

    # -- visiting --------------------------------------------------------------
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == self.top and node.module is None:
            self.module_aliases |= {a.asname or a.name for a in node.names if a.name == "_native"}
        elif node.level == self.top and node.module == "_native":
            self.used |= {("", a.name) for a in node.names}

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.cls = self.cls, node.name
        self.generic_visit(node)
        self.cls = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer = self.locals
        self.locals = dict(outer)
        # `def _flush(writer: _native.CacheWriter, ...)`: the annotation says
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            native = self.annotated(arg.annotation)
            if native is not None:
                self.locals[arg.arg] = native
        # names bound to native objects anywhere in the function (closures included)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                target = sub.targets[0]
                if isinstance(target, ast.Name):
                    native = self.native_type(sub.value)
                    if native is not None:
                        self.locals[target.id] = native
            # `engine: _native.Dataset = ...`: the annotation says
            elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                native = self.annotated(sub.annotation)
                if native is not None:
                    self.locals[sub.target.id] = native
        self.generic_visit(node)
        self.locals = outer

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Name) and value.id in self.module_aliases:
            if node.attr not in self.classes:
                self.used.add(("", node.attr))
        elif (  # `_native.Batch.from_ipc`: a static method read on the class
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id in self.module_aliases
            and value.attr in self.classes
        ):
            self.used.add((value.attr, node.attr))
        elif isinstance(node.ctx, ast.Load):
            native = self.native_type(value)
            if native is not None:
                self.used.add((native, node.attr))
        if not (node.attr == "_native" and isinstance(node.ctx, ast.Store)):
            self.generic_visit(node)
        else:
            self.generic_visit(node.value)

    def visit_Call(self, node: ast.Call) -> None:
        protocol = {"len": "__len__", "next": "__next__", "iter": "__iter__"}
        if isinstance(node.func, ast.Name) and node.func.id in protocol and len(node.args) == 1:
            native = self.native_type(node.args[0])
            if native is not None:
                self.used.add((native, protocol[node.func.id]))
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        native = self.native_type(node.iter)
        if native is not None:
            self.used |= {(native, "__iter__"), (native, "__next__")}
        self.generic_visit(node)


def wrapper_modules() -> dict[Path, ast.Module]:
    """Every module of the package, those of its subpackages (``sources/``) too."""
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def wrapped_classes(modules: dict[Path, ast.Module]) -> dict[str, str]:
    """Wrapper class -> the native class its ``self._native`` holds."""
    returns = stub_returns()
    wrapped: dict[str, str] = {}
    for _ in range(2):  # a second pass resolves classes built from another's native object
        for path, tree in modules.items():
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                visitor = Uses(path, wrapped, returns)
                visitor.module_aliases = {"_native"}
                visitor.cls = cls.name
                for sub in ast.walk(cls):
                    if (
                        isinstance(sub, ast.Assign)
                        and len(sub.targets) == 1
                        and isinstance(sub.targets[0], ast.Attribute)
                        and sub.targets[0].attr == "_native"
                    ):
                        native = visitor.native_type(sub.value)
                        if native is not None:
                            wrapped[cls.name] = native
                    # `self._native: _native.Batch = native`: the annotation says
                    elif (
                        isinstance(sub, ast.AnnAssign)
                        and isinstance(sub.target, ast.Attribute)
                        and sub.target.attr == "_native"
                        and isinstance(sub.annotation, ast.Attribute)
                        and isinstance(sub.annotation.value, ast.Name)
                        and sub.annotation.value.id == "_native"
                    ):
                        wrapped[cls.name] = sub.annotation.attr
    return wrapped


def wrapper_uses() -> tuple[set[tuple[str, str]], set[str], dict[str, str]]:
    modules = wrapper_modules()
    wrapped = wrapped_classes(modules)
    returns = stub_returns()
    used: set[tuple[str, str]] = set()
    unknown: set[str] = set()
    for path, tree in modules.items():
        visitor = Uses(path, wrapped, returns)
        visitor.visit(tree)
        used |= visitor.used
        unknown |= visitor.unknown
    return used, unknown, wrapped


def label(member: tuple[str, str]) -> str:
    return f"_native.{member[0]}.{member[1]}" if member[0] else f"_native.{member[1]}"


def test_the_wrapper_classes_are_found():
    _, _, wrapped = wrapper_uses()
    assert wrapped == {
        "Batch": "Batch",
        "Dataset": "Dataset",
        "Loader": "Loader",
        # records.Reader reads a batch's typed fields through the native batch
        "Reader": "Batch",
        "Worker": "Worker",
        "_Writer": "ScoreWriter",
    }


def test_every_native_read_in_the_wrappers_is_understood():
    _, unknown, _ = wrapper_uses()
    assert not unknown, f"teach this test what these native objects are: {sorted(unknown)}"


def test_every_native_method_is_used_by_a_wrapper():
    used, _, _ = wrapper_uses()
    missing = native_members() - used - NOT_WRAPPED.keys()
    assert not missing, (
        f"no Python wrapper uses {sorted(map(label, missing))}: wrap it, or list it in "
        f"NOT_WRAPPED with the reason"
    )


def test_the_exceptions_are_current():
    used, _, _ = wrapper_uses()
    absent = NOT_WRAPPED.keys() - native_members()
    assert not absent, f"NOT_WRAPPED names what _native does not have: {sorted(absent)}"
    wrapped_now = NOT_WRAPPED.keys() & used
    assert not wrapped_now, f"now used by a wrapper, drop from NOT_WRAPPED: {sorted(wrapped_now)}"


def test_the_wrappers_read_no_native_member_that_does_not_exist():
    used, _, _ = wrapper_uses()
    classes = native_classes()
    # a class whose stub declares ``__getattr__`` (LoaderSpec: one attribute
    # per option, answered by the engine) has any name
    stub = ast.parse((PACKAGE / "_native.pyi").read_text())
    dynamic = {
        cls.name
        for cls in stub.body
        if isinstance(cls, ast.ClassDef)
        and any(isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for f in cls.body)
    }
    unknown = [
        label((c, m))
        for c, m in used
        if not hasattr(classes[c] if c else _native, m) and c not in dynamic
    ]
    assert not unknown, unknown


def test_every_name_in_all_exists():
    assert len(set(datasetrt.__all__)) == len(datasetrt.__all__)
    missing = [n for n in datasetrt.__all__ if not hasattr(datasetrt, n)]
    assert not missing, missing
    namespace: dict[str, object] = {}
    exec("from datasetrt import *", namespace)
    assert set(datasetrt.__all__) <= namespace.keys()


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports at run time.

    Every import statement counts, at module level and inside functions and
    methods (an import in a function closes a loop as surely as one at the
    top: it only runs later), except those under ``if TYPE_CHECKING:``.
    ``from . import name`` (and ``from datasetrt import name``) imports the
    module ``name`` where the package has one, else a name the package's
    ``__init__`` defines: that is an import of ``__init__``. A target that is
    neither fails, so no import can fall outside the graph unnoticed.

    A subpackage (a directory with an ``__init__.py``: ``sources/``) is the
    module ``sources`` (its ``__init__.py``), and each of its other files
    one more, named ``sources.parquet``; ``from .. import _native`` there
    imports the package's ``_native``.
    """
    subpackages = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    files = {p.stem: p for p in sorted(package.glob("*.py"))}
    for sub in subpackages:
        files |= {
            sub if p.stem == "__init__" else f"{sub}.{p.stem}": p
            for p in sorted((package / sub).glob("*.py"))
        }
    modules = set(files) | {p.stem for p in package.glob("*.pyi")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        where = [package.name, *path.relative_to(package).parts[:-1]]
        graph[name] = {
            target
            for node in ast.walk(tree)  # every node: function bodies included
            if id(node) not in typing_only
            for target in import_targets(node, where, modules, subpackages)
        }
        unknown = graph[name] - modules
        assert not unknown, f"{path.name} imports {sorted(unknown)}, not modules of {where[0]}"
    return graph


def import_targets(
    node: ast.AST, where: list[str], modules: set[str], subpackages: list[str]
) -> set[str]:
    """What `node` imports (see :func:`import_graph`), in a file of the
    package or subpackage `where` (``["datasetrt", "sources"]``)."""
    top = where[0]

    def within(parts: list[str], names: list[str]) -> set[str]:
        """What ``from <top>.<parts> import <names>`` imports."""
        if not parts:  # the package itself: its modules, or its __init__'s names
            return {n if n in modules else "__init__" for n in names}
        module = ".".join(parts)
        if module in subpackages:  # the same, one level down
            return {f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names}
        return {module}

    if isinstance(node, ast.ImportFrom):
        if node.level > len(where):
            raise AssertionError(f"teach this test imports from above the package: {node.module}")
        base = where[: len(where) - node.level + 1] if node.level else []
        parts = [*base, *(node.module.split(".") if node.module else [])]
        if parts[:1] != [top]:
            return set()
        return within(parts[1:], [a.name for a in node.names])
    if isinstance(node, ast.Import):
        names = [a.name.split(".") for a in node.names if a.name.split(".")[0] == top]
        return {".".join(n[1:]) or "__init__" for n in names}
    return set()


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle found (``[a, b, a]``), or None."""

    def visit(module: str, path: tuple[str, ...]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        for dep in sorted(graph.get(module, ())):
            found = visit(dep, (*path, module))
            if found:
                return found
        return None

    for module in sorted(graph):
        found = visit(module, ())
        if found:
            return found
    return None


def test_the_package_imports_have_no_cycle():
    """Imports between the package's modules (also those inside functions, not
    those under ``TYPE_CHECKING``) form no cycle: ``torch`` and ``loader`` are
    used by ``dataset``, never the other way round."""
    graph = import_graph(PACKAGE)
    for module in ("torch", "loader", "_state"):
        assert "dataset" not in graph[module], f"{module}.py imports dataset.py at run time"
    cycle = import_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    """The loop this check once missed: ``__init__.build_ray`` imported
    ``ray`` in the function, and ``ray.build_ray`` took ``Dataset`` back from
    the package (``from . import Dataset``, also in a function)."""
    pkg = tmp_path / "datasetrt"
    pkg.mkdir()
    (pkg / "dataset.py").write_text("class Dataset: ...\n")
    (pkg / "_native.pyi").write_text("")
    (pkg / "__init__.py").write_text(
        "from .dataset import Dataset\n\ndef build_ray():\n    from .ray import build_ray\n"
    )
    ray = (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from . import Dataset\n\n"
        "def build_ray():\n    {}\n"
    )
    (pkg / "ray.py").write_text(ray.format("from . import Dataset"))
    assert import_cycle(import_graph(pkg)) == ["__init__", "ray", "__init__"]
    (pkg / "ray.py").write_text(ray.format("import datasetrt"))
    assert import_cycle(import_graph(pkg)) == ["__init__", "ray", "__init__"]
    (pkg / "ray.py").write_text(ray.format("from .dataset import Dataset"))
    assert import_cycle(import_graph(pkg)) is None
    (pkg / "ray.py").write_text(ray.format("pass"))  # TYPE_CHECKING only: no edge
    assert import_graph(pkg)["ray"] == set()


def test_every_wrapped_native_member_keeps_its_name():
    """What a wrapper offers users under a native member's job has the
    native member's name: ``get_item`` on both sides, ``version`` on both,
    ``threads`` on both. Only members the wrappers use to build something of
    another shape (``INTERNAL``) or do not use (``NOT_WRAPPED``) are exempt."""
    classes = native_classes()
    renamed = [
        f"{wrapper.__name__}.{member}"
        for wrapper in (datasetrt.Dataset, datasetrt.Loader, datasetrt.Batch)
        for member in vars(classes[wrapper.__name__])
        if not member.startswith("_")
        and (wrapper.__name__, member) not in NOT_WRAPPED.keys() | INTERNAL.keys()
        and not hasattr(wrapper, member)
    ]
    assert not renamed, f"the wrappers offer these under other names: {renamed}"
    assert INTERNAL.keys() <= native_members(), "INTERNAL names what _native does not have"
