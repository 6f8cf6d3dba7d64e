"""The table formats' names where they were first: a thin re-export, kept for existing imports.

The formats live in :mod:`tabsched.formats` (the registry, ``read_table`` and
``write_table``), one module each: :mod:`tabsched.formats.table_csv` (PyTorch's
compute_only CSV), :mod:`tabsched.formats.table_json` (JSON with metadata and its
schema), :mod:`tabsched.formats.grid` (the text grid); :mod:`tabsched.files` holds
``atomic_write`` and the output checks every writer makes. This module only
imports their public names, so ``from tabsched.io import to_csv`` keeps working;
new code imports from those modules.
"""

from tabsched.files import (atomic_write, check_output_folder, check_output_path,
                            make_output_folder, read_text)
from tabsched.formats import TABLE_SUFFIXES, read_table, write_table
from tabsched.formats.grid import render_grid
from tabsched.formats.table_csv import csv_loss, csv_omits, from_csv, read_csv, to_csv, write_csv
from tabsched.formats.table_json import (JSON_FORMAT, JSON_VERSION, MAX_JSON_DEPTH, from_json,
                                         read_json, to_json, write_json)

__all__ = ["read_table", "write_table", "read_csv", "write_csv", "to_csv", "from_csv",
           "read_json", "write_json", "to_json", "from_json", "render_grid",
           "TABLE_SUFFIXES", "csv_loss", "csv_omits", "atomic_write", "check_output_path",
           "check_output_folder", "make_output_folder", "read_text", "JSON_FORMAT",
           "JSON_VERSION", "MAX_JSON_DEPTH"]
