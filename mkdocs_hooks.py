"""MkDocs hooks (``hooks:`` in mkdocs.yml): pages and figures that tabsched itself writes.

When the site is built, this file

* draws the gallery with tabsched's plotting API (``tabsched.plot``): a Gantt chart per
  schedule family at the table level, a memory plot and a sweep plot under model costs;
* writes one page per schedule family from the registry (``tabsched.families()``): its
  summary, parameters, picture, the formula level's docstring and numbers
  (``tabsched.formulas``) and its sources, so that no family page goes stale;
* adds those pages to the navigation under "Schedule families", and fills the marker
  lines of ``families/index.md``, ``gallery.md`` and ``reference/api.md``.

Nothing is written into ``docs/``: the figures live in a temporary folder and reach the
site as generated files. It takes a few seconds (matplotlib's Agg backend, no display).
"""

import importlib
import inspect
import os
import re
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:          # the checkout's tabsched, the one these docs describe
    sys.path.insert(0, ROOT)

import tabsched  # noqa: E402
from tabsched import UnitCosts  # noqa: E402
from tabsched.formulas import FORMULAS, formula_for  # noqa: E402

DEVICES, MICROBATCHES = 4, 8
#: Family parameters used for the pictures (every other one keeps its default).
PICTURE_PARAMS = {"interleaved-1f1b": {"chunks": 2}, "looped-bfs": {"chunks": 2},
                  "hanayo": {"waves": 2}}
#: The slot lengths of every table-level picture: split backward I = W = 1, full B = 2.
UNIT = {"f": 1, "b": 2, "i": 1, "w": 1}
#: The public modules the API reference documents beside ``tabsched.__all__``.
API_MODULES = ["tabsched.adapt", "tabsched.compare", "tabsched.sweeps", "tabsched.plot",
               "tabsched.formulas", "tabsched.throughput", "tabsched.megatron",
               "tabsched.schedules"]

_state = {}


def _unit_costs():
    return UnitCosts(**UNIT)


def family_table(family):
    """The table a family's page shows: 4 devices, 8 microbatches."""
    params = dict(PICTURE_PARAMS.get(family.name, {}))
    if any(parameter.name == "costs" for parameter in family.parameters):
        params["costs"] = _unit_costs()
    return tabsched.generate(family.name, devices=DEVICES, microbatches=MICROBATCHES,
                             **params), params


def _rst_to_markdown(text):
    """Docstring prose as Markdown: ``code`` -> `code`, :func:`x` -> `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _family_page(family, picture, numbers, params, result):
    module = sys.modules[family.build.__module__]
    formula = FORMULAS.get(family.name)
    shown = ", ".join(f"`{k}={v}`" for k, v in params.items() if k != "costs")
    lines = [f"# {family.name}", "", _rst_to_markdown(family.summary) + ".", "",
             f"![{family.name}: Gantt chart at {DEVICES} devices, {MICROBATCHES} microbatches]"
             f"(../{picture})", "",
             f"The table at p = {DEVICES}, M = {MICROBATCHES}"
             + (f" ({shown})" if shown else "")
             + ", run with unit slots F = 1, B = 2, I = W = 1 and no communication (the table"
             f" level): makespan {result.makespan:g} slots, bubble ratio"
             f" {result.bubble_ratio:.1%}. Drawn by `tabsched.plot.gantt` when this site was"
             " built; from the command line:", "", "```",
             f"tabsched plot gantt {family.name} -p {DEVICES} -m {MICROBATCHES}"
             + "".join(f" --{k.replace('_', '-')} {v}" if k in ('chunks', 'waves')
                       else f" --param {k}={v}" for k, v in params.items() if k != "costs")
             + f" --f 1 --b 2 --i 1 --w 1 -o {family.name}.png", "```", ""]
    lines += ["## Parameters", "", "| parameter | default | meaning |", "|---|---|---|"]
    for parameter in family.parameters:
        default = "required" if parameter.default is None and not parameter.optional else (
            "derived" if parameter.default is None else f"`{parameter.default}`")
        text = _rst_to_markdown(parameter.help).replace("|", "\\|")
        lines.append(f"| `{parameter.name}` | {default} | {text} |")
    lines += ["", "## Formula level", ""]
    if formula is None:
        lines += ["tabsched registers no formula for this family.", ""]
    else:
        lines += ["From `tabsched/formulas.py` (the docstring of its formula function):", ""]
        lines += ["> " + line if line else ">" for line in
                  _rst_to_markdown(inspect.cleandoc(formula.__doc__ or "")).split("\n")]
        lines.append("")
        if numbers and numbers.get("bubble_ratio") is not None:
            lines.append(f"At this size the formula level gives a bubble ratio of "
                         f"{numbers['bubble_ratio']:.1%}"
                         + (f", exact when {numbers['exact_when']}" if numbers.get('exact_when')
                            else "") + ".")
        else:
            note = (numbers or {}).get("note") or (numbers or {}).get("reason")
            lines.append("At this size the formula level gives no bubble ratio"
                         + (f": {note}" if note else "") + ".")
        lines.append("")
    lines += ["## Sources", ""]
    if numbers and numbers.get("source"):
        lines += [f"- Formula: {_rst_to_markdown(str(numbers['source']))}"]
    lines += [f"- Generator: `{module.__name__.replace('.', '/')}.py`, whose docstring says:",
              ""]
    doc = _rst_to_markdown(inspect.cleandoc(module.__doc__ or "")).replace(
        "SCHEDULES.md", "the project's SCHEDULES.md")
    lines += ["    > " + line if line else "    >" for line in doc.split("\n")]
    lines.append("")
    return "\n".join(lines)


def _draw_family(name, folder):
    """Draw one family's table-level Gantt chart; returns what its page needs."""
    from tabsched import plot
    family = next(family for family in tabsched.families() if family.name == name)
    table, params = family_table(family)
    result = tabsched.evaluate(table, _unit_costs())
    picture = f"gallery/family-{family.name}.png"
    plot.gantt(result, os.path.join(folder, picture))
    try:
        numbers = formula_for(table)
    except Exception:    # a family without a formula at this size
        numbers = None
    return picture, _family_page(family, picture, numbers, params, result)


def _gallery(folder):
    """Draw every figure into ``folder``; returns ``{site path: caption}`` and the pages."""
    from tabsched import plot
    figures, pages = {}, {}
    names = [family.name for family in tabsched.families()]
    # drawn here, one after another: mkdocs loads this hook as a module no other process
    # can import, so a process pool cannot pickle its functions
    drawn = [_draw_family(name, folder) for name in names]
    for name, (picture, page) in zip(names, drawn):
        pages[f"families/{name}.md"] = page
        figures[picture] = (f"{name}, p = {DEVICES}, M = {MICROBATCHES}, table level",
                            f"families/{name}.md")
    costs = tabsched.ModelCosts("paper-128l", "mid_nw_mid_cp")
    result = tabsched.evaluate(tabsched.generate("zbv", devices=4, microbatches=8), costs)
    plot.gantt(result, os.path.join(folder, "gallery/zbv-model.svg"))
    figures["gallery/zbv-model.svg"] = ("zbv, p = 4, M = 8, `paper-128l` on `mid_nw_mid_cp`:"
                                        " the simulation level, links drawn", None)
    costs = tabsched.ModelCosts("paper-128l", "dgx-h100")
    result = tabsched.evaluate(tabsched.generate("1f1b", devices=8, microbatches=32), costs,
                               memory_budget="80GB")
    plot.memory_plot(result, os.path.join(folder, "gallery/memory-1f1b.png"), budget=80e9)
    figures["gallery/memory-1f1b.png"] = ("memory over time, 1f1b, p = 8, M = 32,"
                                          " `paper-128l` on `dgx-h100`, 80 GB budget", None)
    rows = tabsched.sweep(["gpipe", "1f1b", "chimera"], [8], [8, 16, 32, 64],
                          systems=["mid_nw_mid_cp"], global_batch=256)
    plot.sweep_plot(rows, os.path.join(folder, "gallery/sweep.png"), devices=8)
    figures["gallery/sweep.png"] = ("iteration time (simulation) against microbatches,"
                                    " gpipe, 1f1b and chimera at p = 8, global batch 256,"
                                    " `paper-128l` on `mid_nw_mid_cp`", None)
    return figures, pages


def on_config(config):
    """Draw the gallery, write the family pages and put them into the navigation."""
    began = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="tabsched-docs-")
    os.makedirs(os.path.join(folder, "gallery"))
    figures, pages = _gallery(folder)
    _state.update(folder=folder, figures=figures, pages=pages)
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Schedule families" in entry:
            section = entry["Schedule families"]
            section[:] = [item for item in section if not (
                isinstance(item, str) and item.startswith("families/")
                and item != "families/index.md")]
            section.extend(sorted(pages))
    print(f"INFO    -  mkdocs_hooks: gallery and {len(pages)} family pages in "
          f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
    return config


def on_files(files, config):
    """Hand the figures and family pages to MkDocs as generated files."""
    from mkdocs.structure.files import File
    for path in _state["figures"]:
        files.append(File.generated(config, path,
                                    abs_src_path=os.path.join(_state["folder"], path)))
    for path, text in _state["pages"].items():
        files.append(File.generated(config, path, content=text))
    return files


def _families_list(page_path):
    lines = ["| family | what it is |", "|---|---|"]
    for family in tabsched.families():
        target = f"{family.name}.md" if page_path.startswith("families/") else (
            f"families/{family.name}.md")
        lines.append(f"| [{family.name}]({target}) | {_rst_to_markdown(family.summary)} |")
    return "\n".join(lines)


def _gallery_markdown():
    out = []
    for path, (caption, page) in _state["figures"].items():
        out.append(f"![{caption}]({path})\n\n{caption}"
                   + (f" ([page]({page}))" if page else "") + "\n")
    return "\n".join(out)


def public_definitions():
    """``{module: [names]}``: where each name of ``tabsched.__all__`` is defined."""
    found = {}
    for name in tabsched.__all__:
        value = getattr(tabsched, name)
        if inspect.ismodule(value):
            continue                       # a module (adapt): documented as a module below
        module = getattr(value, "__module__", None) or "tabsched"
        found.setdefault(module, []).append(name)
    return found


def _api_markdown():
    out = []
    for module, names in sorted(public_definitions().items()):
        out.append(f"## `{module}`\n")
        for name in names:
            out.append(f"::: {module}.{name}\n")
    return "\n".join(out)


def module_members(module_name):
    """The names of a public module's ``__all__`` that the API page does not already show."""
    module = importlib.import_module(module_name)
    shown = {id(getattr(tabsched, name)) for name in tabsched.__all__}
    return [name for name in getattr(module, "__all__", [])
            if id(getattr(module, name)) not in shown]


def _modules_markdown():
    out = []
    for module in API_MODULES:
        members = module_members(module)
        listed = "[" + ", ".join(members) + "]" if members else "false"
        out.append(f"## `{module}`\n\n::: {module}\n    options:\n      show_root_heading: false"
                   f"\n      heading_level: 3\n      members: {listed}\n")
    return "\n".join(out)


MARKERS = {"<!-- families -->": _families_list, "<!-- gallery -->": lambda _: _gallery_markdown(),
           "<!-- api -->": lambda _: _api_markdown(),
           "<!-- modules -->": lambda _: _modules_markdown()}


def on_page_markdown(markdown, page, config, files):
    """Fill the marker lines of the pages that list what tabsched generates."""
    for marker, fill in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, fill(page.file.src_uri))
    return markdown
