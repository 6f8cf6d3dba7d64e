"""The documentation: every public name has a docstring for the API reference, the site's
configuration keeps its checks, and the README and CI agree on the commands.

The site itself is built by ``mkdocs build --strict`` in CI (``.ci/run``); these tests need
neither MkDocs nor a network, so they run with the rest of the suite."""

import ast
import importlib
import inspect
import pathlib
import re

import pytest

import tabsched

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: CI's scripts are in a checkout, not in an sdist (MANIFEST.in), whose tests run too.
needs_ci = pytest.mark.skipif(not (ROOT / ".ci").is_dir(),
                              reason=".ci/ is in a checkout only, not in an sdist")


def api_modules():
    """The public modules the API reference documents (``API_MODULES`` of mkdocs_hooks.py,
    read without importing the hook, which sets up matplotlib)."""
    tree = ast.parse((ROOT / "mkdocs_hooks.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "API_MODULES"
                for target in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("mkdocs_hooks.py has no API_MODULES")


def documented(value):
    """Whether ``value`` carries a docstring of its own (data constants need none)."""
    if not (inspect.ismodule(value) or inspect.isclass(value) or callable(value)):
        return True
    doc = value.__doc__ if inspect.isclass(value) else inspect.getdoc(value)
    if not doc or not doc.strip():
        return False
    if inspect.isclass(value) and doc.startswith(f"{value.__name__}("):
        return False            # the signature a dataclass writes when it has no docstring
    return True


def missing_docstrings():
    """``module.name`` of every public name without a docstring."""
    missing = [f"tabsched.{name}" for name in tabsched.__all__
               if not documented(getattr(tabsched, name))]
    for module_name in api_modules():
        module = importlib.import_module(module_name)
        if not documented(module):
            missing.append(module_name)
        missing += [f"{module_name}.{name}" for name in getattr(module, "__all__", [])
                    if not documented(getattr(module, name))]
    return sorted(set(missing))


def undocumented_members(cls):
    """Public methods and properties ``cls`` defines itself without a docstring (fields are
    the class docstring's to describe; an inherited method keeps its base's docstring)."""
    missing = []
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            value = value.fget
        elif not inspect.isfunction(value):
            continue
        if value is None or not (value.__doc__ or "").strip():
            missing.append(f"tabsched.{cls.__name__}.{attr}")
    return missing


def test_every_public_member_of_a_public_class_has_a_docstring():
    missing = [member for name in tabsched.__all__
               if inspect.isclass(getattr(tabsched, name))
               for member in undocumented_members(getattr(tabsched, name))]
    assert not missing, f"{len(missing)} public members have no docstring: {', '.join(missing)}"


def test_the_member_check_recognises_a_missing_docstring():
    class Bare:
        @property
        def size(self):
            return 1

        def run(self):
            """Runs."""

        def _private(self):
            pass

    assert undocumented_members(Bare) == ["tabsched.Bare.size"]


def test_the_api_reference_documents_public_modules_that_exist():
    modules = api_modules()
    assert "tabsched.adapt" in modules
    for name in modules:
        assert getattr(importlib.import_module(name), "__all__", None), f"{name} has no __all__"


def test_every_public_name_has_a_docstring():
    missing = missing_docstrings()
    assert not missing, f"{len(missing)} public names have no docstring: {', '.join(missing)}"


def test_the_check_recognises_a_missing_docstring():
    from dataclasses import dataclass

    @dataclass
    class Bare:
        x: int = 0

    def bare():
        pass

    assert not documented(Bare) and not documented(bare)
    assert documented(tabsched.generate) and documented(tabsched.Execution)
    assert documented(3) and documented({"a": 1})


def test_the_site_builds_strictly_with_its_hook_and_both_generators():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^strict: true$", text, flags=re.M)
    assert "- mkdocs_hooks.py" in text
    assert "docstring_style: numpy" in text and "mkdocstrings" in text
    assert "- mkdocs-click" in text
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert ":module: tabsched.cli" in cli
    from tabsched.cli import cli as group
    command = re.search(r":command: (\w+)", cli).group(1)
    assert getattr(importlib.import_module("tabsched.cli"), command) is group


@needs_ci
def test_every_page_the_nav_names_exists_or_is_written_by_the_hook():
    import sys
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        readme_commands = importlib.import_module("readme_commands")
    finally:
        sys.path.pop(0)
    pages = readme_commands.nav_pages(ROOT / "mkdocs.yml")
    assert pages[0] == "index.md" and "reference/cli.md" in pages
    for page in pages:
        assert (ROOT / "docs" / page).exists(), f"mkdocs.yml's nav names {page}, not in docs/"
    on_disk = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert on_disk <= set(pages), f"pages outside the nav: {sorted(on_disk - set(pages))}"
    names = {family.name for family in tabsched.families()}
    assert not any((ROOT / "docs" / "families" / f"{name}.md").exists() for name in names), (
        "family pages are written by mkdocs_hooks.py; a committed one would go stale")


def test_the_docs_extra_has_lower_bounds():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^docs = \[\n(.*?)^\]", text, flags=re.M | re.S).group(1)
    for package in ("mkdocs", "mkdocs-material", "mkdocstrings[python]", "mkdocs-click"):
        assert re.search(rf'"{re.escape(package)}>=[\d.]+"', block), package


def readme_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```\n(.*?)```", text, flags=re.S)


@needs_ci
def test_ci_runs_the_readme_set_up_and_test_commands_and_builds_the_docs():
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.split("#")[0].strip() for line in run.splitlines()]
    blocks = "\n".join(readme_blocks())
    assert "pip install -e '.[test]'" in blocks and "pip install -e '.[test]'" in lines
    assert "python -m pytest" in blocks and "python -m pytest" in lines
    assert lines.index("pip install -e '.[docs]'") > lines.index("python .ci/readme_commands.py")
    assert 'mkdocs build --strict --site-dir "$work/site"' in lines


def test_the_readme_does_not_claim_a_release_on_pypi():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"pip install ['\"]?tabsched\b", text)
    assert "not on PyPI" in text
    for path in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (ROOT / path).exists(), f"README.md links {path}, which does not exist"


def test_the_readme_picture_is_committed_and_small():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    picture = re.search(r"!\[[^\]]*\]\(([^)]+)\)", text).group(1)
    path = ROOT / picture
    assert path.exists() and path.stat().st_size < 200_000
    assert f"-o {picture}" in " ".join(text.split()), "the README says which command drew it"


def test_the_reference_reads_stray_prose_and_doctests_as_their_own_sections():
    # the docs extra (pip install -e '.[docs]'); CI installs it after the suite
    pytest.importorskip("griffe", reason="griffe comes with the docs extra")
    import sys
    sys.path.insert(0, str(ROOT))
    try:
        from docs_griffe import restructure
    finally:
        sys.path.pop(0)
    text = ("Summary.\n\nParameters\n----------\nx : int\n    The x.\n\n"
            "Durations scale with x.\n\n>>> f(1)\n[(1, 2)]\n\nSee :func:`g`.")
    out = restructure(text)
    assert "\nNotes\n-----\nDurations scale" in out
    assert "```pycon\n>>> f(1)\n[(1, 2)]\n```" in out
    assert "\nExamples\n--------\n```pycon" in out and "See `g`." in out
    assert restructure("x : int\n    The x.") == "x : int\n    The x."
