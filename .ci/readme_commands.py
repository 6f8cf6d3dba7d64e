"""Run every command the README and the documentation pages show, in order, as a user would.

The files are README.md, then every page of docs/ in the order of mkdocs.yml's ``nav``
(the commands were one README before, and a later page may use what an earlier one wrote:
``plot sweep sweep.csv`` reads the sweep of the page before it), then any page of docs/ the
nav does not list. Each shell block of each file is read line by line (a trailing backslash continues
a line); the lines that start with ``tabsched`` or ``python`` run with ``bash -c`` in
one scratch folder, so a command may use the files an earlier one wrote, and the
README's ``examples/``, ``bench/`` and ``tests/data/`` (the example measurements the
README imports) are reachable there, as in a checkout. A command must exit 0,
unless its comment names the status it documents (``exit 3``, ``refused``).

Left out, with the reason printed: installing packages, the test suite itself (CI has
just run it), a command that needs a named Dask scheduler, and the PyTorch examples
when torch is not installed.

    python .ci/readme_commands.py [FILE...]      # default: README.md and docs/ in nav order
    python .ci/readme_commands.py --list          # print the commands, run nothing
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = [("pip install", "installs packages"),
        ("python -m pytest", "the test suite (CI runs it)"),
        ("tcp://", "needs a running Dask scheduler named in the command")]
TORCH = ("examples/torch_pipeline.py", "examples/measure_vs_predict.py", "zbv-run/")
TIMEOUT = 900


def commands(text):
    """``(line number, command, comment)`` of every shell line in the README's blocks."""
    found, shell, inside = [], False, False
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        index += 1
        if line.startswith("```"):
            if inside:
                inside = False
            else:
                inside, shell = True, line[3:].strip() in ("", "bash", "sh", "console")
            continue
        if not (inside and shell):
            continue
        while line.rstrip().endswith("\\") and index < len(lines):
            command, _, comment = line.rstrip()[:-1].partition("  #")
            line = command.rstrip() + " " + lines[index].strip() + (
                f"  #{comment}" if comment else "")
            index += 1
        command, _, comment = line.partition("  #")
        command = command.strip()
        if command.startswith(("tabsched ", "python ")):
            found.append((number, command, comment.strip()))
    return found


def nav_pages(mkdocs_yml):
    """The ``.md`` paths of mkdocs.yml's ``nav``, in order (read without a YAML parser, so
    this runs before the docs extra is installed: every nav entry is one line)."""
    pages, inside = [], False
    with open(mkdocs_yml, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line.startswith((" ", "-")):
                inside = line.startswith("nav:")
                continue
            match = re.search(r"(?:^|:\s|-\s)([\w./-]+\.md)\s*$", line.strip())
            if inside and match:
                pages.append(match.group(1))
    return pages


def documents():
    """README.md, then docs/ pages in nav order, then pages the nav leaves out (sorted)."""
    found = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    listed = [os.path.join(docs, page) for page in nav_pages(os.path.join(ROOT, "mkdocs.yml"))]
    found += [path for path in listed if os.path.exists(path)]   # generated pages have no file
    for folder, _, names in sorted(os.walk(docs)):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.endswith(".md") and path not in found:
                found.append(path)
    return found


def allowed_status(comment):
    """The exit statuses a command's comment documents (0 otherwise)."""
    match = re.search(r"exit (\d)", comment)
    if match:
        return {int(match.group(1))}
    if "refused" in comment:
        return {1}
    return {0}


def main():
    arguments = sys.argv[1:]
    listing = "--list" in arguments
    arguments = [argument for argument in arguments if argument != "--list"]
    files = [os.path.abspath(argument) for argument in arguments] or documents()
    found = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            label = os.path.relpath(path, ROOT)
            found += [(f"{label}:{number}", command, comment)
                      for number, command, comment in commands(handle.read())]
    if listing:
        for place, command, comment in found:
            print(f"{place}: {command}" + (f"  # {comment}" if comment else ""))
        return
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    scratch = tempfile.mkdtemp(prefix="readme-")
    for folder in ("examples", "bench", os.path.join("tests", "data")):
        os.makedirs(os.path.dirname(os.path.join(scratch, folder)), exist_ok=True)
        os.symlink(os.path.join(ROOT, folder), os.path.join(scratch, folder))
    failures, ran, skipped = [], 0, 0
    began_all = time.perf_counter()
    for place, command, comment in found:
        reason = next((why for text, why in SKIP if text in command), None)
        if reason is None and not have_torch and any(text in command for text in TORCH):
            reason = "needs torch, which is not installed"
        if reason:
            print(f"{place}: skipped ({reason}): {command}", flush=True)
            skipped += 1
            continue
        began = time.perf_counter()
        try:
            done = subprocess.run(["bash", "-c", command], cwd=scratch, capture_output=True,
                                  text=True, timeout=TIMEOUT)
            status, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            status, err = "timeout", f"ran over {TIMEOUT} s"
        seconds = time.perf_counter() - began
        ran += 1
        expected = allowed_status(comment)
        verdict = "ok" if status in expected else "FAILED"
        print(f"{place}: {verdict} (exit {status}, {seconds:.1f} s): {command}", flush=True)
        if status not in expected:
            failures.append((place, command, status, err.strip().splitlines()[-3:]))
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{ran} commands ran, {skipped} skipped, {len(failures)} failed, from "
          f"{len(files)} files in {time.perf_counter() - began_all:.0f} s")
    for place, command, status, tail in failures:
        print(f"  {place}: exit {status}: {command}")
        for line in tail:
            print(f"      {line}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
