"""Run every command the README shows, in order, as a user would.

Each shell block of README.md is read line by line (a trailing backslash continues
a line); the lines that start with ``tabsched`` or ``python`` run with ``bash -c`` in
one scratch folder, so a command may use the files an earlier one wrote, and the
README's ``examples/``, ``bench/`` and ``tests/data/`` (the example measurements the
README imports) are reachable there, as in a checkout. A command must exit 0,
unless its comment names the status it documents (``exit 3``, ``refused``).

Left out, with the reason printed: installing packages, the test suite itself (CI has
just run it), a command that needs a named Dask scheduler, and the PyTorch examples
when torch is not installed.

    python .ci/readme_commands.py [README.md]
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


def allowed_status(comment):
    """The exit statuses a command's comment documents (0 otherwise)."""
    match = re.search(r"exit (\d)", comment)
    if match:
        return {int(match.group(1))}
    if "refused" in comment:
        return {1}
    return {0}


def main():
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    with open(readme, encoding="utf-8") as handle:
        found = commands(handle.read())
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
    for number, command, comment in found:
        reason = next((why for text, why in SKIP if text in command), None)
        if reason is None and not have_torch and any(text in command for text in TORCH):
            reason = "needs torch, which is not installed"
        if reason:
            print(f"README.md:{number}: skipped ({reason}): {command}", flush=True)
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
        print(f"README.md:{number}: {verdict} (exit {status}, {seconds:.1f} s): {command}",
              flush=True)
        if status not in expected:
            failures.append((number, command, status, err.strip().splitlines()[-3:]))
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{ran} README commands ran, {skipped} skipped, {len(failures)} failed")
    for number, command, status, tail in failures:
        print(f"  README.md:{number}: exit {status}: {command}")
        for line in tail:
            print(f"      {line}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
