"""The text files that the suite reads and writes: YAML and JSON lines, with errors that name file and line.

Every config, sweep file and run record goes through here, so bad input reads the same everywhere: a
``FileFormatError`` (a ``ValueError``: the commands print it as one ``hyla X: error:`` line) naming the
file, the line (and column) and what to do. A JSON-lines record (a run's metrics, ``made_by.jsonl``) is
appended one line per write; a process killed mid-write (``kill -9``, a full disk) leaves a torn last line
without its newline. Readers drop that line with a ``TornLineWarning`` naming the file; writers cut it
off before they append. Any other malformed line is an error. YAML is read by ``StrictLoader``: a
mapping that gives a key twice is an error naming file, line and key (PyYAML would keep the last one
silently). Every record file is written by ``write_file`` or ``write_text_atomic``, whose
``OSError`` names the file even where the operating system names none (a full disk fails in ``write``);
``write_failure`` says such an error in words. For the commands: ``error_line`` (an error as the
one line after ``error:``) and ``print_warnings_on_one_line``. Imports nothing from ``hyla``: every
layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


class FileFormatError(ValueError):
    """A file the suite reads is unreadable or malformed; the message names the file and, where known, line
    and column."""


class TornLineWarning(UserWarning):
    """A JSON-lines file ended in a torn line (a write cut off); the line was dropped."""


_python_formatwarning = warnings.formatwarning


def _format_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    if issubclass(category, TornLineWarning):
        return f"hyla: warning: {message}\n"
    return _python_formatwarning(message, category, filename, lineno, line)


def print_warnings_on_one_line() -> None:
    """For the command line: a ``TornLineWarning`` printed as one ``hyla: warning:`` line (it names the
    file), without Python's second line quoting the source that warned. Other warnings are left as they are."""
    warnings.formatwarning = _format_warning


def error_line(err: Exception) -> str:
    """What a command prints after ``error:``; an operating-system error (an ``--out`` that cannot be
    written) as ``path: No such file or directory`` rather than Python's ``[Errno 2] ...``."""
    if not isinstance(err, OSError):
        return str(err)
    names = [str(n) for n in (err.filename, err.filename2) if n is not None]
    return f"{' -> '.join(names)}: {err.strerror or err}" if names else str(err)


# ------------------------------------------------------------------------------ YAML
class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping gives a key twice."""


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping giving a key twice, where PyYAML keeps the last one silently
    (a sweep's ``rows: {a: ..., a: ...}`` would lose a row). Keys a merge (``<<: *base``) brings in may be
    given again: that is what a merge is for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first_seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = first_seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the constructor below names it
                    continue
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(
                        None, None, f"duplicate key {key!r} (first at line {first.line + 1})", key_node.start_mark
                    )
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` by ``StrictLoader``: what every config, sweep file and override value is read with."""
    return yaml.load(text, Loader=StrictLoader)  # safe: StrictLoader is a SafeLoader


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What PyYAML found wrong, on one line (its own text spans several, with a drawing of the spot)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return problem + (f" ({context})" if context else "")


def yaml_error_text(err: yaml.YAMLError) -> str:
    """One line for a YAML error in a value given on the command line: ``column C: problem``."""
    mark = getattr(err, "problem_mark", None)
    return (f"column {mark.column + 1}: " if mark is not None else "") + _yaml_problem(err)


def read_yaml(path: Path) -> Any:
    """The YAML document of ``path`` (None when empty); a syntax error as ``path:line:column: problem``."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise FileFormatError(f"{path}: cannot read it ({getattr(err, 'strerror', None) or err})") from err
    try:
        return load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        position = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        if isinstance(err, DuplicateKeyError):
            raise FileFormatError(
                f"{path}{position}: {_yaml_problem(err)} in one mapping; YAML would keep only the last silently, "
                "so remove or rename one"
            ) from err
        raise FileFormatError(f"{path}{position}: YAML syntax error: {_yaml_problem(err)}; fix the file there") from err


# ------------------------------------------------------------------------------ writing
#: what a failed write says when the disk or its permissions, not the program, are at fault
DISK_FAULTS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` raised inside that names no file: a full disk fails in ``write`` or
    ``fsync``, whose errors do not say which file."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        raise


def write_failure(err: OSError) -> str:
    """A failed write in words: ``no space left on device writing PATH`` (another kind: its own text)."""
    kind = DISK_FAULTS.get(err.errno or 0) or err.strerror or str(err)
    return f"{kind} writing {err.filename}" if err.filename is not None else kind


def write_file(path: Path, data: str | bytes, *, append: bool = False, sync: bool = True) -> None:
    """Write (``append``: add) ``data`` to ``path``, created with the process's umask, flushed to the disk
    (``sync``); an ``OSError`` names ``path`` (``naming``)."""
    mode = ("a" if append else "w") + ("b" if isinstance(data, bytes) else "")
    with naming(path), open(path, mode) as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


# ------------------------------------------------------------------------------ JSON lines
def jsonl_line(record: dict[str, Any]) -> str:
    """The one way a record is written: what ``read_jsonl`` reads back to an equal record."""
    return json.dumps(record) + "\n"


def _parse_record(raw: bytes) -> dict[str, Any]:
    record = json.loads(raw.decode("utf-8"))
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped). A torn last line (malformed and without its
    newline) is dropped with a ``TornLineWarning``; any other malformed line raises
    ``FileFormatError`` naming file and line."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as err:
        raise FileFormatError(f"{path}: cannot read it ({err.strerror or err})") from err
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(_parse_record(raw))
        except ValueError as err:
            if number == len(lines):  # no newline after it: the write was cut off
                preview = raw[:60].decode("utf-8", "replace") + ("..." if len(raw) > 60 else "")
                warnings.warn(
                    f"{path}: dropped its torn last line {preview!r} (a write cut off, e.g. by kill -9 or a full disk)",
                    TornLineWarning,
                    stacklevel=2,
                )
                break
            raise FileFormatError(
                f"{path}:{number}: malformed line ({err}); fix or delete line {number} "
                "(only a torn last line is skipped)"
            ) from err
    return records


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Replace ``path`` by ``text`` (or bytes) in one step: a crash or a full disk leaves the old file or the
    new, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")  # one writer per file: a fixed name, left over only by a crash
    try:
        write_file(tmp, text)
        with naming(path):
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def rewrite_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the records of ``path`` by ``records`` (atomically)."""
    write_text_atomic(path, "".join(jsonl_line(r) for r in records))


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return False
        f.seek(size - 1)
        return f.read(1) != b"\n"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Add ``record`` as the last line of ``path``; a torn last line is cut off first (so the new line does
    not join it), a complete one that lost only its newline gets it back."""
    if path.exists() and _ends_mid_line(path):
        rewrite_jsonl(path, read_jsonl(path))
    write_file(path, jsonl_line(record), append=True, sync=False)
