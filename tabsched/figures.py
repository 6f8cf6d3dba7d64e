"""What every tabsched picture shares: the palette, figures on a plain matplotlib
``Figure``, the print settings they are written with (``PRINT_RC``: TrueType fonts in a
PDF, text as ``<text>`` in an SVG), their atomic saving, and titles that fit.

matplotlib is imported when a picture is drawn (:func:`matplotlib_module`), never by
``import tabsched``; without the ``plot`` extra a picture is a one-line error naming it.
The Gantt and memory pictures are :mod:`tabsched.plot`, a sweep's
:mod:`tabsched.plot_sweep`.
"""

import os

from tabsched._extras import require
from tabsched.exceptions import InvalidParameterError
from tabsched.files import atomic_write, check_output_path

__all__ = ["PALETTE", "LINE_COLORS", "MARKERS", "LINESTYLES", "CAPACITY", "PICTURE_SUFFIXES",
           "DPI", "PRINT_RC", "matplotlib_module", "check_picture_path", "save_figure",
           "fit_title"]


#: A colour-blind-safe palette (Okabe and Ito 2008, "Color Universal Design",
#: https://jfly.uni-koeln.de/color/): distinguishable under the common colour-vision
#: deficiencies, and in greyscale together with the markers and line styles below.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
           "#F0E442")
#: Twelve categorical line colours: the eight above, then four of Paul Tol's "muted"
#: scheme (https://personal.sron.nl/~pault/, "Colour schemes and templates", 2021) that
#: differ from them: wine, indigo, olive, teal. Neighbouring lines never get near-equal
#: shades, as they did from a sequential colour map.
LINE_COLORS = PALETTE + ("#882255", "#332288", "#999933", "#44AA99")
#: matplotlib's marker and line-style codes; with the colours they make every line's
#: (colour, marker, line style) unique for up to 12 x 8 x 4 = 384 lines
#: (:func:`line_style`).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


CAPACITY = "#C00000"
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


DPI = 150


#: matplotlib settings in force while tabsched writes a figure (matplotlib's rcParams,
#: https://matplotlib.org/stable/users/explain/customizing.html): fonts embedded as
#: TrueType (Type 42) in PDF and PostScript, not as Type 3, which camera-ready checkers
#: (IEEE PDF eXpress among them) refuse; SVG text kept as <text>, not drawn as paths, so
#: it can be searched, selected and restyled. Applied with ``rc_context`` around the
#: save only, so the caller's own rcParams are left as they were.
PRINT_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}


def _print_settings():
    """A context in which figures are written with ``PRINT_RC``."""
    return matplotlib_module().rc_context(PRINT_RC)


def matplotlib_module(name="matplotlib"):
    """``name`` from matplotlib, or a one-line error naming the ``plot`` extra."""
    return require(name, "plot", "drawing pictures")


def _figure(width, height):
    return matplotlib_module("matplotlib.figure").Figure(figsize=(width, height),
                                                          layout="constrained")


def check_picture_path(path, inputs=()):
    """Refuse, before drawing, a picture path with another suffix or in no folder (or one
    that names an input, ``inputs``: ``files.check_output_path``)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in PICTURE_SUFFIXES:
        raise InvalidParameterError(f"{path}: pictures are written as "
                                    f"{', '.join(PICTURE_SUFFIXES)}, not {suffix or 'no suffix'}")
    check_output_path(path, inputs=inputs)
    return suffix


def save_figure(figure, path):
    """Write ``figure`` to ``path`` (PNG, SVG or PDF by suffix), atomically, with
    ``PRINT_RC``: TrueType fonts in a PDF, text as text in an SVG.

    matplotlib writes a temporary file beside ``path``, which replaces it only
    once complete (:func:`tabsched.files.atomic_write`).
    """
    suffix = check_picture_path(path)

    def write(temporary):
        with _print_settings():
            figure.savefig(temporary, dpi=DPI, format=suffix[1:])
    atomic_write(path, write=write)


def _root_figure(artist):
    figure = artist.figure
    while getattr(figure, "_parent", None) is not None:       # a subfigure's figure
        figure = figure._parent
    return figure


def _wrapped(text, chars):
    """``text`` in lines of at most ``chars`` characters, two at most: the second
    shortened with an ellipsis at its end if the text is longer."""
    import textwrap
    lines = textwrap.wrap(text, max(chars, 1), break_on_hyphens=False)
    if len(lines) > 2:
        rest = " ".join(lines[1:])
        lines = [lines[0], rest[:max(chars - 1, 1)].rstrip() + "\u2026"]
    return "\n".join(lines)


def fit_title(artist, margin_points=3.0):
    """Make a title (any text artist) fit inside its figure's width.

    A title wider than the room on either side of where it is anchored (its axes'
    centre, the figure's centre for a suptitle) is wrapped into two lines, the second
    shortened with an ellipsis at its end: the start of a title, which names the
    schedule, is never cut. The figure is laid out (without rendering) to measure.
    """
    text = " ".join(artist.get_text().split())
    if not text:
        return artist
    figure = _root_figure(artist)
    if _surely_fits(artist, figure):
        return artist
    margin = margin_points * figure.dpi / 72
    for _ in range(4):
        figure.draw_without_rendering()
        box = artist.get_window_extent()      # with the renderer the layout used
        frame = figure.bbox
        align = artist.get_horizontalalignment()
        if align == "center":
            middle = (box.x0 + box.x1) / 2
            room = 2 * (min(middle - frame.x0, frame.x1 - middle) - margin)
        elif align == "left":
            room = frame.x1 - margin - box.x0
        else:
            room = box.x1 - frame.x0 - margin
        if box.width <= room:
            break
        longest = max(len(line) for line in artist.get_text().split("\n"))
        artist.set_text(_wrapped(text, int(0.95 * longest * max(room, 0) / box.width)))
    return artist


#: A generous estimate of the mean advance width of a title's characters, in ems, in
#: DejaVu Sans (its hmtx table: most lower-case letters about 0.6 em, digits 0.64, a
#: space 0.32; only m and w, 0.97 and 0.82, and capitals such as M and W are wider).
TITLE_EMS = 0.7


def _surely_fits(artist, figure):
    """Whether a centred title fits by a generous estimate (no layout needed to check)."""
    if artist.get_horizontalalignment() != "center":
        return False
    longest = max(len(line) for line in artist.get_text().split("\n"))
    wide = longest * TITLE_EMS * artist.get_fontsize() / 72 / figure.get_figwidth()
    if artist.axes is not None:
        box = artist.axes.get_position()         # before the layout: roughly where it goes
        middle = (box.x0 + box.x1) / 2
    else:
        middle = artist.get_position()[0]        # a suptitle: in figure coordinates
    return wide <= 2 * min(middle, 1 - middle) * 0.8
