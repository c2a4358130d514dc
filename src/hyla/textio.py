"""The text files that the suite reads and writes: YAML and JSON lines, with errors that name file and line.

Every config, sweep file and run record goes through here, so bad input reads the same everywhere: a
:class:`FileFormatError` (a ``ValueError``: the commands print it as one ``hyla X: error:`` line) naming the
file, the line (and column) and what to do. A JSON-lines record (a run's metrics, ``made_by.jsonl``) is
appended one line per write; a process killed mid-write (``kill -9``, a full disk) leaves a torn last line
without its newline. Readers drop that line with a :class:`TornLineWarning` naming the file; writers cut it
off before they append. Any other malformed line is an error. For the commands: :func:`error_line` (an
error as the one line after ``error:``) and :func:`print_warnings_on_one_line`. Imports nothing from
``hyla``: every layer may use it.
"""

from __future__ import annotations

import json
import os
import warnings
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
    """For the command line: a :class:`TornLineWarning` printed as one ``hyla: warning:`` line (it names the
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
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        position = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise FileFormatError(f"{path}{position}: YAML syntax error: {_yaml_problem(err)}; fix the file there") from err


# ------------------------------------------------------------------------------ JSON lines
def jsonl_line(record: dict[str, Any]) -> str:
    """The one way a record is written: what :func:`read_jsonl` reads back to an equal record."""
    return json.dumps(record) + "\n"


def _parse_record(raw: bytes) -> dict[str, Any]:
    record = json.loads(raw.decode("utf-8"))
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped). A torn last line (malformed and without its
    newline) is dropped with a :class:`TornLineWarning`; any other malformed line raises
    :class:`FileFormatError` naming file and line."""
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


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` in one step: a crash leaves the old file or the new, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")  # one writer per file: a fixed name, left over only by a crash
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    with open(path, "a") as f:
        f.write(jsonl_line(record))
