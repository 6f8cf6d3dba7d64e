"""Files: reading an untrusted one whole, and writing so that a failure loses nothing.

Every reader of a file tabsched did not write starts from :func:`read_text`: the
file's bytes as UTF-8 text, with every problem (it cannot be read, a byte is not
UTF-8, a NUL byte) one error naming the file. Every writer goes through
:func:`atomic_write` (git's lockfile): the content goes to a temporary file in the
same folder, which replaces the target only once written in full, so a failed
write (disk full, quota, ``ulimit -f``) leaves the previous file as it was and no
partial file behind. Commands check their outputs before any work
(:func:`check_output_path`, :func:`check_output_folder`), so that a long run does
not end in a path it cannot write.
"""

import os
import tempfile

from tabsched.exceptions import InvalidParameterError, InvalidScheduleError, OutputError

__all__ = ["read_text", "atomic_write", "check_output_path", "check_output_folder",
           "make_output_folder", "suffix", "file_path"]


def file_path(path, name="path", error=InvalidParameterError,
              expected="a file path (text or os.PathLike)"):
    """``path`` as text (``os.fspath``), or ``error`` naming ``name`` if it is no file path.

    An integer is refused, not taken for a file descriptor: ``open(1)`` would write to,
    and then close, standard output. So is text with a NUL character, which no file
    name holds.

    >>> file_path(True, "out")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: out must be a file path (text or os.PathLike), not True
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        from tabsched.cells import shown_repr
        raise error(f"{name} must be {expected}, not {shown_repr(path)}")
    if "\x00" in text:
        from tabsched.cells import shown
        raise error(f"{name} {shown(text)} holds a NUL character, which no file name holds")
    try:
        os.fsencode(text)
    except UnicodeEncodeError as problem:   # "\\ud800": not a name the system can hold
        from tabsched.cells import shown
        raise error(f"{name} {shown(text)} holds a lone surrogate at character "
                    f"{problem.start}, which no file name holds") from None
    return text


def suffix(path):
    """The lower-case suffix of ``path`` (``".csv"``), or ``""``."""
    return os.path.splitext(file_path(path))[1].lower()


def read_text(path, *, expected="this is not a schedule file", error=InvalidScheduleError,
              nul=False):
    """The UTF-8 text of an untrusted file (a leading byte-order mark dropped).

    Every problem is one ``error`` naming the file: it cannot be read, a byte is not
    UTF-8 (``expected`` says what the file should have been), and, with ``nul``, a
    line holds a NUL byte.
    """
    path = file_path(path, error=error)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as problem:
        raise error(f"{path}: cannot read: {problem.strerror or problem}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(f"{path}: byte {problem.start} is not UTF-8 text; {expected}") from None
    if nul and "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise error(f"{path}: line {line} contains a NUL byte; {expected}")
    return text


def check_output_path(path, *, suffixes=None, what="output", inputs=()):
    """Refuse, before any work, an output file that cannot be written.

    The folder must exist and be writable, the path must not be a folder, and
    its suffix, if ``suffixes`` is given, one of them. A path that is a symbolic
    link, or exists and is not a regular file (a FIFO, a device), is refused: the
    atomic write would replace the link or the special file with a plain file, which
    is never what was meant. So is a path that names one of the command's
    ``inputs`` (the same file, by any name): the input would be gone before it was
    read whole. Raises ``OutputError``.
    """
    path = file_path(path, error=OutputError)
    if suffixes is not None and suffix(path) not in suffixes:
        raise OutputError(f"{path}: the {what} must end in {', '.join(suffixes)}, not "
                          f"{suffix(path) or 'no suffix'}")
    if os.path.islink(path):
        raise OutputError(f"{path}: is a symbolic link; writing would replace the link with "
                          f"a file: give the path it points to, or another")
    if os.path.isdir(path):
        raise OutputError(f"{path}: is a folder; give the {what} file's name")
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutputError(f"{path}: exists and is not a regular file (a FIFO or a device); "
                          f"writing would replace it: give another path")
    for source in inputs:
        if source is None or not os.path.isfile(source) or not os.path.exists(path):
            continue
        if os.path.samefile(path, source):
            raise OutputError(f"{path}: is also this command's input ({os.fspath(source)}); "
                              f"write the {what} elsewhere")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write into the folder {folder} (permission denied)")


def check_output_folder(path):
    """Refuse, before any work, an output folder that is a file or cannot be made."""
    path = os.fspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise OutputError(f"{path}: exists and is not a folder; give a folder for the "
                              f"output")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{path}: cannot write into this folder (permission denied)")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f"{path}: cannot make this folder: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot make this folder in {parent} (permission denied)")


def make_output_folder(path):
    """Make the output folder ``path`` (and its parents); ``OutputError`` naming it if not."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise OutputError(f"{path}: cannot make this folder: {error.strerror}") from None


class staged_folder:
    """Write a folder's files as one unit: ``with staged_folder(out) as stage:`` writes into
    ``stage`` (a hidden folder inside ``out``); only when the block ends without an error
    is each file moved over its namesake in ``out`` (``os.replace``, one by one, every
    file complete before the first moves); on any error, SIGINT and SIGTERM included, the
    stage is removed and ``out`` holds what it held before.

    ``stage.final(name)`` is the path a file will have in ``out``; ``stage.path(name)``
    the path to write it at now.
    """

    def __init__(self, out_dir):
        self.out_dir = os.fspath(out_dir)
        self.stage = None

    def __enter__(self):
        make_output_folder(self.out_dir)
        try:
            self.stage = tempfile.mkdtemp(prefix=".tabsched-", suffix=".tmp", dir=self.out_dir)
        except OSError as error:
            raise OutputError(f"{self.out_dir}: cannot write into this folder: "
                              f"{error.strerror or error}") from None
        return self

    def path(self, name):
        return os.path.join(self.stage, name)

    def final(self, name):
        return os.path.join(self.out_dir, name)

    def __exit__(self, kind, value, trace):
        import shutil
        try:
            if kind is None:
                for name in sorted(os.listdir(self.stage)):
                    try:
                        os.replace(self.path(name), self.final(name))
                    except OSError as error:
                        raise OutputError(f"{self.final(name)}: cannot write: "
                                          f"{error.strerror or error}") from None
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)
        return False


def _new_file_mode(path):
    """The mode a file at ``path`` gets: that of the file it replaces, else 0666 less umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path, content=None, *, write=None, newline=None):
    """Write a file so that a failure leaves the previous one intact (git's lockfile).

    The content goes to a temporary file in the same folder, which is flushed
    to disk and then renamed over ``path`` (``os.replace``, atomic on POSIX).
    If anything fails, the temporary file is removed and ``path`` is as it was.

    Parameters
    ----------
    path : str or path-like
    content : str or bytes, optional
        What to write (text is UTF-8).
    write : callable, optional
        Instead of ``content``: ``write(temporary_path)`` writes the file itself
        (matplotlib's ``savefig``). The temporary name keeps ``path``'s suffix.
    newline : str, optional
        Newline translation for text, as ``open``'s (``""``: none).

    Raises
    ------
    OutputError
        Naming ``path`` and the system's reason (e.g. "File too large").
    """
    path = file_path(path, error=OutputError)
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    mode = _new_file_mode(path)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp"
                                             f"{os.path.splitext(name)[1]}", dir=folder)
    except OSError as error:
        raise OutputError(f"{path}: cannot write: {error.strerror or error}") from None
    try:
        if write is not None:
            os.close(handle)
            write(temporary)
            with open(temporary, "rb+") as written:
                os.fsync(written.fileno())
        else:
            binary = isinstance(content, bytes)
            with os.fdopen(handle, "wb" if binary else "w",
                           **({} if binary else {"encoding": "utf-8", "newline": newline})) as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as error:
        _remove(temporary)
        raise OutputError(f"{path}: cannot write: {error.strerror or error}; the previous "
                          f"file, if any, is unchanged") from None
    except BaseException:
        _remove(temporary)
        raise


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
