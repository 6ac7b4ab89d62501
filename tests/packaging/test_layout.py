"""The architecture, checked: layers only import downward, and no module imports itself back.

The layers, lowest first (ARCHITECTURE.md draws them):

    kernel.protos, kernel.core          the serving core and its schema
    | triton_python_backend_utils       what a model.py imports (nothing of Kernel)
    kernel.config, kernel.observe       config.pbtxt; metrics, trace, log
    kernel.loading | kernel.proxy       the one loader, model control, repository API;
                                        PyTriton's Request type (a plain data type)
    kernel.transports | kernel.backends
    kernel.serve                        composition: CLI, in-process server, SageMaker entry
    the PyTriton face                   kernel.triton, kernel.decorators, kernel.client, ...

A module may import its own layer's package and anything below; packages that share a layer do
not import each other (transports never touch a backend). The check reads the source with `ast`,
so it sees imports inside functions too; only imports under `if TYPE_CHECKING:` are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

# Source folder -> the package name it installs as (pyproject.toml's package-dir).
FOLDERS = {
    "kernel": "kernel",
    "transports": "kernel.transports",
    "backends": "kernel.backends",
    "triton_python_backend_utils": "triton_python_backend_utils",
}

# (layer number, package prefixes). Longest prefix wins, so kernel.transports is not "kernel".
LAYERS = [
    (0, ["kernel.protos", "kernel.core"]),
    (0, ["triton_python_backend_utils"]),  # what model.py imports; it imports nothing of Kernel
    (2, ["kernel.proxy"]),  # PyTriton's Request type: what bound callables receive from the callable backend
    (1, ["kernel.config"]),
    (1, ["kernel.observe"]),
    (2, ["kernel.loading"]),
    (3, ["kernel.transports"]),
    (3, ["kernel.backends"]),
    (4, ["kernel.serve", "kernel.__main__"]),
    (5, ["kernel.triton", "kernel.triton_config", "kernel.triton_model", "kernel.workspace", "kernel.decorators",
         "kernel.model_config", "kernel.client", "kernel.exceptions", "kernel.remote"]),
]
# kernel/__init__.py holds only the version string; every layer may read it.
SHARED = {"kernel"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _group(module: str):
    best = None
    for index, (level, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[2]):
                    best = (level, index, prefix)
    return best


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    own_package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    out.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = own_package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module
                for alias in child.names:
                    full = f"{target}.{alias.name}"
                    out.add(full if full in modules else target)
            visit(child)

    visit(tree)
    return {name for name in out if name.split(".")[0] in ("kernel", "triton_python_backend_utils")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {t for t in _imports(name, path, modules) if t != name} for name, path in modules.items()}


def test_every_module_belongs_to_a_layer(graph):
    assert [m for m in graph if m not in SHARED and _group(m) is None] == []


def test_layers_only_import_downward(graph):
    wrong = []
    for module, targets in graph.items():
        here = _group(module)
        if here is None:
            continue
        for target in targets:
            if target in SHARED:
                continue
            there = _group(target)
            if there is None:
                wrong.append(f"{module} -> {target} (unknown layer)")
            elif there[0] > here[0]:
                wrong.append(f"{module} -> {target} (layer {here[0]} imports layer {there[0]})")
            elif there[0] == here[0] and there[1] != here[1]:
                wrong.append(f"{module} -> {target} (side by side: {here[2]} and {there[2]})")
    assert wrong == []


def test_no_import_cycles(graph):
    # Tarjan's strongly connected components over module imports.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for v in graph:
            if v not in index:
                strongconnect(v)
    finally:
        sys.setrecursionlimit(limit)
    assert cycles == []


# What each plug layer may import from the layers below it (ARCHITECTURE.md, "Plug interfaces are
# narrow"): a transport turns its wire format into core requests and reaches model control through
# the server (`server.control`, kernel.core.backend.ModelControlHandle); a backend uses what
# CoreHandle lists. Neither imports the loader, model control or config.pbtxt internals
# (kernel.loading, kernel.config), which are composition's to attach. Observability is theirs to
# report into; PyTriton's Request type is what the callable backend hands a bound callable.
PLUG_IMPORTS = {
    "kernel.transports": {"kernel.core", "kernel.protos", "kernel.observe"},
    "kernel.backends": {"kernel.core", "kernel.protos", "kernel.observe", "kernel.proxy",
                        "triton_python_backend_utils"},
}


def _plug_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        plug = next((p for p in PLUG_IMPORTS if module == p or module.startswith(p + ".")), None)
        if plug is None:
            continue
        for target in targets:
            if target in SHARED or target == plug or target.startswith(plug + "."):
                continue
            if not any(target == a or target.startswith(a + ".") for a in PLUG_IMPORTS[plug]):
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_transports_and_backends_reach_loading_through_the_server(graph):
    assert _plug_violations(graph) == []


def test_plug_check_sees_a_transport_importing_the_loader(tmp_path):
    """The check itself can fail: the imports issue 27 found (a transport reading kernel.loading's
    FILE_PREFIX and validate_model_name) are reported, and a config.pbtxt internal too."""
    fake = tmp_path / "m.py"
    fake.write_text("from kernel.loading.files import FILE_PREFIX\nfrom kernel.loading.names import validate_model_name\n"
                    "from kernel.config import pbtxt\nfrom kernel.core.backend import ModelControlHandle\n")
    modules = _modules()
    graph = {"kernel.transports.http.fake": _imports("kernel.transports.http.fake", fake, modules)}
    assert _plug_violations(graph) == [
        "kernel.transports.http.fake -> kernel.config.pbtxt",
        "kernel.transports.http.fake -> kernel.loading.files",
        "kernel.transports.http.fake -> kernel.loading.names",
    ]


def test_checker_sees_an_upward_import(tmp_path):
    """The check itself can fail: a core module importing a transport is reported."""
    fake = tmp_path / "m.py"
    fake.write_text("from kernel.transports.http import app\n")
    modules = _modules()
    targets = _imports("kernel.core.fake", fake, modules)
    assert "kernel.transports.http.app" in targets
    assert _group("kernel.transports.http.app")[0] > _group("kernel.core.fake")[0]


MAX_LINES = 600


def test_no_oversized_hand_written_module():
    """Modules over ~600 lines say in their docstring why they must be one piece."""
    big = []
    for name, path in _modules().items():
        if path.name.endswith("_pb2.py"):
            continue  # generated by protoc
        text = path.read_text()
        if text.count("\n") > MAX_LINES and "one piece" not in (ast.get_docstring(ast.parse(text)) or ""):
            big.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert big == []
