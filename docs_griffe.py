"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings ``extensions:``).

tabsched's docstrings are numpydoc where they have sections (``Parameters``,
``Returns``), but many end a section with prose or doctests and no heading, which the
numpydoc parser reads as more parameters, and many hold doctests in their prose, whose
output (``[(33.0, 66.0)]``) Markdown would read as links. Before griffe parses a
docstring, this extension

* puts a ``Notes`` heading before a prose paragraph that follows a section's entries, and
* writes Sphinx roles as code (:func:`plan` as `plan`), which Markdown would show raw, and
* fences every doctest (a run of ``>>>`` and ``...`` lines and the output after them) as
  a ``pycon`` code block,

so the pages show what the source says without editing the source for the renderer.
"""

import re

from griffe import Extension

SECTIONS = {"parameters", "other parameters", "returns", "yields", "receives", "raises",
            "warns", "attributes", "methods"}
_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|obj|exc|const):`~?([^`]+)`")
_ENTRY = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(\s*,\s*\*{0,2}[A-Za-z_][\w.]*)*\s*(:.*)?$")


def _is_underline(line):
    return bool(line) and set(line.strip()) <= {"-"} and len(line.strip()) >= 3


def restructure(text):
    """``text`` (a cleaned docstring) with headings before stray prose and fenced doctests."""
    lines = text.split("\n")
    out, section, index = [], None, 0
    while index < len(lines):
        line = lines[index]
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.strip() and not line.startswith(" ") and _is_underline(following):
            section = line.strip().lower()
            out += [line, following]
            index += 2
            continue
        if line.startswith(">>>"):
            block = []
            while index < len(lines) and lines[index].strip():
                block.append(lines[index])
                index += 1
            if section is not None and section != "examples":
                out += ["Examples", "--------"]
                section = "examples"
            out += ["```pycon"] + block + ["```"]
            continue
        if (section in SECTIONS and line.strip() and not line.startswith(" ")
                and out and not out[-1].strip() and not _ENTRY.match(line)):
            out += ["Notes", "-----"]
            section = "notes"
        out.append(_ROLE.sub(r"`\1`", line))
        index += 1
    return "\n".join(out)


class DocstringSections(Extension):
    """Restructure each docstring before it is parsed (see the module docstring)."""

    def on_instance(self, *, obj, **kwargs):
        docstring = getattr(obj, "docstring", None)
        if docstring is not None and docstring.value:
            docstring.value = restructure(docstring.value)
