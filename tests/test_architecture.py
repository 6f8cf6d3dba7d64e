"""The layout the architecture map (ARCHITECTURE.md) promises: no import cycle among
tabsched's modules, and every name and path the README and the documentation pages (docs/)
use exists."""

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tabsched"


def module_names():
    """Every module of the package: dotted name -> source path (or None for the kernel)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    for path in PACKAGE.rglob("*.pyx"):
        modules[".".join(path.relative_to(ROOT).with_suffix("").parts)] = None
    return modules


def imported_modules(path, name, modules):
    """tabsched modules ``path`` imports anywhere in its body (functions included).

    ``from package import name`` counts as importing ``package.name`` when that is a
    module, else ``package``. A submodule's implicit import of its parent package is
    not counted: Python resolves it without running the parent's imports again.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif base in modules:
                    found.add(base)
    return found - {name}


def import_graph():
    modules = module_names()
    return {name: imported_modules(path, name, modules)
            for name, path in modules.items() if path is not None}


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "tabsched.plot" in graph["tabsched.cli.plot"]      # imported inside a command
    assert "tabsched.costs.transformer" in graph["tabsched.costs.model_costs"]
    assert "tabsched._kernel" in graph["tabsched.engine"]
    assert "tabsched.engine" in graph["tabsched.lower"]


def test_the_engine_is_the_only_importer_of_the_kernel():
    """Which pass runs is decided in one place (``tabsched/engine.py``): no other
    library module imports ``_kernel`` or its AVX2 build, at the top or in a function
    (the test oracle and the tests' helpers read its constants and entry points)."""
    graph = import_graph()
    compiled = {"tabsched._kernel", "tabsched._kernel_avx2"}
    importers = sorted(name for name, targets in graph.items() if targets & compiled)
    assert importers == ["tabsched._reference", "tabsched.engine"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_tabsched_modules():
    assert cycles(import_graph()) == []


def test_the_table_does_not_import_the_lowering():
    graph = import_graph()
    assert "tabsched.lower" not in graph["tabsched.table"]
    assert "tabsched.layout" not in graph["tabsched.table"]


def documents():
    """README.md and every page of docs/ (the README's manual moved there)."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def python_blocks():
    """``(document, code)`` of every Python block of the README and the docs pages."""
    return [(path.relative_to(ROOT), block) for path in documents()
            for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"),
                                    flags=re.S)]


def readme_python():
    """The Python of the README and the docs pages, in the order the pages are read."""
    return "\n".join(block for _, block in python_blocks())


def test_the_docs_pages_hold_the_python_the_readme_held():
    assert len(python_blocks()) >= 6          # the six blocks the README held before issue 25
    assert any(str(document).startswith("docs") for document, _ in python_blocks())


def test_readme_python_blocks_parse():
    for document, block in python_blocks():
        try:
            ast.parse(block)
        except SyntaxError as error:
            raise AssertionError(f"{document}: a Python block does not parse: {error}")


def readme_imports():
    """``(module, name)`` for every name the README's Python imports or reads off a module."""
    tree = ast.parse(readme_python())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((alias.name, None) for alias in node.names)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "tabsched"):
            names.add(("tabsched", node.attr))
    return sorted(names, key=lambda pair: (pair[0], pair[1] or ""))


@pytest.mark.parametrize("module, name", readme_imports())
def test_every_name_the_readme_uses_imports(module, name):
    imported = importlib.import_module(module)
    if name is not None:
        assert hasattr(imported, name), f"{module} has no {name}"


def test_readme_names_public_names_only_from_all():
    import tabsched
    for module, name in readme_imports():
        if module == "tabsched" and name is not None:
            assert name in tabsched.__all__, f"tabsched.{name} is not in tabsched.__all__"


def test_every_source_path_the_docs_name_exists():
    for path in documents() + [ROOT / "ARCHITECTURE.md"]:
        document = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        for path in re.findall(r"`((?:tabsched|tests|bench)/[\w/.]+\.(?:py|pyx|pxd|toml))`",
                               text):
            assert (ROOT / path).exists(), f"{document} names {path}, which does not exist"


def test_the_architecture_map_names_every_module():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for name in module_names():
        leaf = name.rpartition(".")[2]
        if leaf in ("__main__",) or name == "tabsched":
            continue
        assert leaf in text, f"ARCHITECTURE.md does not mention {name}"


def test_public_names_resolve_and_the_lazy_ones_load_on_first_use():
    """Every name of ``tabsched.__all__`` resolves; the modules behind the lazy ones
    (adapt, formats.kineto, formats.pytorch_csv, sweeps) are not imported by ``import tabsched`` or the CLI,
    and ``evaluate`` and ``lower`` stay the functions after their modules are imported."""
    import subprocess
    import sys
    code = (
        "import sys, tabsched, tabsched.cli\n"
        "lazy = ['tabsched.adapt', 'tabsched.formats.kineto', 'tabsched.formats.pytorch_csv',\n"
        "        'tabsched.sweeps']\n"
        "assert not [m for m in lazy if m in sys.modules], sorted(sys.modules)\n"
        "import importlib.metadata as metadata\n"
        "assert tabsched.__version__ == metadata.version('tabsched')\n"
        "import tabsched.evaluate, tabsched.lower, tabsched.sweeps\n"
        "assert callable(tabsched.evaluate) and callable(tabsched.lower)\n"
        "for name in tabsched.__all__:\n"
        "    assert getattr(tabsched, name) is not None, name\n"
        "assert tabsched.sweep is tabsched.sweeps.sweep and tabsched.adapt.adapt\n"
        "assert set(tabsched.__all__) <= set(dir(tabsched))\n"
        "try:\n"
        "    tabsched.no_such_name\n"
        "except AttributeError as error:\n"
        "    assert 'no_such_name' in str(error)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _module_state():
    """``{(module, name): repr}`` of every dict, list, set and bytearray bound at the top
    level of a tabsched module (its constants, registries filled at import...)."""
    import pkgutil
    import sys

    import tabsched
    from tabsched.schedules import families
    for info in pkgutil.walk_packages(tabsched.__path__, "tabsched."):
        if info.name != "tabsched._kernel_avx2":   # loaded by _kernel where the CPU has AVX2
            importlib.import_module(info.name)
    families()                       # every family module, as listing them imports them
    state = {}
    for name, module in list(sys.modules.items()):
        if not (name == "tabsched" or name.startswith("tabsched.")) or module is None:
            continue
        for attribute, value in vars(module).items():
            if type(value) in (dict, list, set, bytearray) and not attribute.startswith("__"):
                state[name, attribute] = repr(value)
    return state


def test_the_library_keeps_no_module_level_mutable_state(tmp_path):
    """Module-level dicts, lists and sets are constants: a workload through the public API
    and the command line (evaluations, sweeps, Monte Carlo, the search, files) leaves them
    as importing left them. Caches live in tabsched._memo, as memos of frozen values."""
    import tabsched
    from tabsched.adapt import Noise, adapt, monte_carlo
    from tabsched.cli import main
    before = _module_state()
    table = tabsched.generate("1f1b", devices=4, microbatches=8)
    costs = tabsched.ModelCosts("paper-128l", "mid_nw_mid_cp", data_parallel=2)
    for cost_model in (tabsched.UnitCosts(b=2), tabsched.StageCosts(1.0, comm=0.1,
                                                                   contention="link"), costs):
        tabsched.evaluate(table, cost_model).critical_path
    tabsched.evaluate_summaries(tabsched.generate("zbv", devices=4, microbatches=8), [costs])
    tabsched.sweep(["gpipe", "chimera"], [4], [8], systems=["mid_nw_mid_cp"])
    monte_carlo(table, costs, Noise(0.1), samples=64)
    adapt(table, costs, Noise(0.1), "400GB", samples=8, max_rounds=1)
    tabsched.write_table(table, tmp_path / "t.json")
    tabsched.read_table(tmp_path / "t.json")
    with pytest.raises(SystemExit):
        main(["eval", "zb-auto", "-p", "4", "-m", "8", "--model", "paper-128l", "--system",
              "mid_nw_mid_cp", "--json"])
    after = _module_state()
    changed = sorted(f"{module}.{name}" for module, name in set(before) | set(after)
                     if before.get((module, name)) != after.get((module, name)))
    assert not changed, f"module-level state changed at run time: {changed}"


def test_no_function_rebinds_a_module_global():
    """No ``global`` statement anywhere in the library: state at module level is bound once."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Global)]
        assert not found, f"{path.relative_to(ROOT)}:{found[0]}: a global statement"
