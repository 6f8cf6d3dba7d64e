"""Optional dependencies: a missing extra is one line naming the command that installs it."""

import json
import sys

import pytest

from tabsched import MissingDependencyError, TabschedError
from tabsched._extras import install_command, require
from tabsched.sweeps import grid_tasks, run_sweep


@pytest.fixture
def without(monkeypatch):
    """Make ``import <name>`` fail as if the package were not installed."""
    def hide(*names):
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)
    return hide


class FakeDistribution:
    def __init__(self, record):
        self.record = record

    def read_text(self, name):
        assert name == "direct_url.json"
        return None if self.record is None else json.dumps(self.record)


@pytest.mark.parametrize("record, command", [
    (None, "pip install 'tabsched[plot]'"),
    ({"url": "https://files.example/tabsched-0.1.0.tar.gz", "archive_info": {}},
     "pip install 'tabsched[plot]'"),
    ({"url": "file:///home/me/tabsched", "dir_info": {"editable": True}},
     "pip install -e '/home/me/tabsched[plot]'"),
    ({"url": "file:///home/me/tabsched", "dir_info": {}}, "pip install 'tabsched[plot]'"),
])
def test_install_command_fits_how_tabsched_was_installed(monkeypatch, record, command):
    from importlib import metadata      # _extras imports it when it writes a hint
    monkeypatch.setattr(metadata, "distribution", lambda name: FakeDistribution(record))
    assert install_command("plot") == command


def test_require_names_the_extra(without):
    without("matplotlib", "matplotlib.figure")
    with pytest.raises(MissingDependencyError,
                       match=r"^drawing pictures needs matplotlib, which is not installed: "
                             r"pip install .*\[plot\]'$"):
        require("matplotlib.figure", "plot", "drawing pictures")
    assert issubclass(MissingDependencyError, TabschedError)
    assert issubclass(MissingDependencyError, ImportError)


def test_dask_missing_is_one_clear_error(without):
    without("distributed")
    tasks = grid_tasks(["gpipe"], [2], [2], systems=("mid_nw_mid_cp",))
    with pytest.raises(MissingDependencyError,
                       match=r"^--dask needs distributed, which is not installed: "
                             r"pip install .*\[dask\]'$"):
        run_sweep(tasks, dask="local")


def test_plot_without_matplotlib_is_one_line(cli, without, tmp_path):
    without("matplotlib", "matplotlib.figure", "matplotlib.patches")
    code, _, err = cli("plot", "gantt", "1f1b", "-p", "2", "-m", "2",
                       "-o", str(tmp_path / "g.png"))
    assert code == 1 and err.count("\n") == 1
    assert "drawing pictures needs matplotlib, which is not installed" in err and "[plot]" in err
    assert not (tmp_path / "g.png").exists()


def test_study_without_matplotlib_refuses_before_the_work(cli, without, tmp_path):
    without("matplotlib", "matplotlib.figure")
    code, _, err = cli("study", "tabular-paper", "-o", str(tmp_path / "study"))
    assert code == 1 and err.count("\n") == 1 and "[plot]" in err
    assert not (tmp_path / "study").exists()


def test_import_tabsched_needs_no_optional_dependency():
    import subprocess
    code = ("import sys\n"
            "for name in ('matplotlib', 'distributed', 'dask', 'pandas', 'torch'):\n"
            "    sys.modules[name] = None\n"
            "import tabsched, tabsched.cli, tabsched.plot, tabsched.sweeps\n"
            "t = tabsched.generate('1f1b', devices=2, microbatches=2)\n"
            "print(tabsched.evaluate(t, tabsched.UnitCosts()).makespan)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "9.0"


def test_version_comes_from_the_package_metadata():
    from importlib import metadata

    import tabsched
    assert tabsched.__version__ == metadata.version("tabsched")
