"""Writing a file so that readers see the old content or the new one, never a part: the one way files
are written; and reading a file from elsewhere so that it cannot hang, flood or steer the tool: the
one way such files are read (`read_limited`, `parse_json`, `parse_yaml`, `check_owned`).

Temp file beside the target (a leading dot, so Parquet datasets and globs skip it), fsync,
rename over the target, fsync the folder; the temp file is removed on any failure. OSError
reaches the caller, which knows what the file was for and words the error.

What is written as it goes (a log, a process's output) goes through `open_own` and `own_dir`:
a link at the name is replaced, never written through, like the rename above replaces one.

A file from elsewhere (a measured or learned profile, a config.json, a replay table, a launcher
profile, a results folder's own files) is read by `read_limited`: a regular file only (a device
reads without end, a FIFO blocks), no link into another user's file, its size bounded before a
byte is read. Its text is parsed by `parse_json` or `parse_yaml`: nesting depth bounded (the
parsers recurse), integers of at most MAX_INT_DIGITS digits (a 400-digit one overflows every
float conversion), every number finite, duplicate keys refused (a second value would win without
a word). Each refusal is a FileRefused (exit 2): one line naming the file, the field and the limit.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from sweeper.errors import SweepError

MAX_DEPTH = 32  # the files read here nest a few levels; the parsers recurse, so 200,000 brackets would not end well
MAX_INT_DIGITS = 18  # below 2**63: every integer fits an int64 column and converts to a float


def atomic_write(
    path: Path, write: Callable[[Path], object], *, tmp_dir: Path | None = None, private: bool = True
) -> None:
    """Call `write(tmp)` to fill a temp file, then put it in place of `path` atomically.

    `tmp_dir` (same file system) keeps the temp file out of the target's folder, for readers that
    refuse a folder holding anything else (Polars reading a Parquet dataset). `private`: 0600, as
    everything a results folder holds for the tool; a file written for the user to read or share
    (a plan, a report) takes the mode any new file gets (0666 less the umask: 0644 usually).
    """
    tmp = (tmp_dir or path.parent) / f".{path.name}.{os.getpid()}.tmp"
    try:
        if tmp_dir is not None:
            tmp_dir.mkdir(exist_ok=True)
        tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
        write(tmp)
        os.chmod(tmp, 0o600 if private else 0o666 & ~_umask())  # a results folder is its owner's alone
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, *, private: bool = True) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data), private=private)


def atomic_write_text(path: Path, text: str, *, private: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), private=private)


def _umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (the folder's entry, not only the file's data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def own_dir(path: Path) -> Path:
    """A folder of the tool's own at `path` (made 0700 when missing): a link there is removed and
    replaced by the folder, never followed (a copied results folder may hold one)."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def open_own(path: Path, *, append: bool = False) -> BinaryIO:
    """Open a file of the tool's own for writing, never through a link: a symbolic link, a hard
    link or anything but a plain file at `path` is removed first (the file starts anew), and
    O_NOFOLLOW refuses a link put there in between."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or not append):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_EXCL)
    return os.fdopen(os.open(path, flags, 0o600), "ab" if append else "wb")


# ---- reading files from elsewhere ---------------------------------------------------------------
class FileRefused(SweepError):
    """A file from elsewhere that is not read, or not used: one line naming the file, the field and the limit."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_limited(path: Path, *, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them, checked before reading:
    a device, FIFO or folder is refused (opened without blocking, then checked again on the open
    file, in case it was swapped), so is a link to a file another user owns, and a file over the
    limit (by its size, then by what a read returns: /proc files say 0 bytes)."""
    try:
        st = path.stat()
    except OSError as e:
        raise FileRefused(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{path}: {_kind(st.st_mode)}; only a regular file is read here")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise FileRefused(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: {_kind(st.st_mode)}; only a regular file is read here")
        if path.is_symlink() and st.st_uid != os.geteuid():
            raise FileRefused(
                f"{path}: a link to {os.path.realpath(path)}, a file of user {st.st_uid}, not yours; "
                "copy the file here instead of linking it"
            )
        if st.st_size > max_bytes:
            raise FileRefused(f"{path}: {st.st_size} bytes; at most {max_bytes} are read here")
        data = bytearray()
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > max_bytes:
            raise FileRefused(f"{path}: over {max_bytes} bytes; at most {max_bytes} are read here")
        return bytes(data)
    finally:
        os.close(fd)


def check_owned(path: Path, *, fix: str, mode_fix: str | None = None, st: os.stat_result | None = None) -> None:
    """Refuse a file or folder another user owns, or others may write: whoever can write it decides
    what the tool does with it. `fix` says what to do about another owner (a command, or why it
    matters), `mode_fix` about others' write permission (default: the `chmod` that makes it the
    user's alone). `st`: its lstat, when the caller has it already."""
    st = st if st is not None else path.lstat()
    if st.st_uid != os.geteuid():
        raise FileRefused(f"{path}: owned by user {st.st_uid}, not you ({os.geteuid()}); {fix}")
    if stat.S_ISLNK(st.st_mode):
        # a link's own mode is always 777 and `chmod` would change its target: name the link itself
        raise FileRefused(f"{path}: a link (to {os.readlink(path)}), not a file or folder of its own; {fix}")
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise FileRefused(
            f"{path}: writable by others (mode {mode:o}); {mode_fix or f'`chmod go-w {path}` makes it yours alone'}"
        )


def check_private_file(path: Path, *, refusing: str) -> None:
    """A plain file of the user's (not a link, a device or a folder) that nobody else may write: one the
    tool is about to trust like code. `refusing` says what is not done otherwise ("refusing to unpickle it")."""
    try:
        st = path.lstat()
    except OSError as e:
        raise FileRefused(f"{path}: cannot check it before reading: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a link" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
        raise FileRefused(f"{path}: {kind}, not a plain file; {refusing}")
    check_owned(path, fix=refusing, mode_fix=refusing, st=st)


class _Big:
    """A number out of bounds where the JSON parser met it, refused with its field by `_checked`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def why(self) -> str:
        digits = len(self.text.lstrip("-+"))
        if self.text.lstrip("-+").isdigit():
            return f"an integer of {digits} digits; at most {MAX_INT_DIGITS}"
        return f"{self.text[:20]} is not a finite number"


def _json_int(text: str) -> int | _Big:
    return _Big(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _json_float(text: str) -> float | _Big:
    value = float(text)
    return value if math.isfinite(value) else _Big(text)


def _checked(value: Any, field: str) -> None:
    if isinstance(value, _Big):
        raise ValueError(f"{field}: {value.why()}")
    if isinstance(value, list):
        for i, v in enumerate(value):
            _checked(v, f"{field}[{i}]")


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key}: given twice; a key may appear once")
        _checked(value, key)
        out[key] = value
    return out


def json_depth(text: str) -> int:
    """The deepest nesting of brackets in JSON text, strings left out."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json(data: bytes, path: Path, *, what: str = "JSON", max_depth: int = MAX_DEPTH) -> Any:
    """JSON text of a file from elsewhere (see the module's docstring for what is refused)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileRefused(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if (depth := json_depth(text)) > max_depth:
        raise FileRefused(f"{path}: nested {depth} levels deep; at most {max_depth}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_json_object,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_Big,
        )
        _checked(value, "the file")
    except json.JSONDecodeError as e:
        raise FileRefused(f"{path}: not {what} ({' '.join(str(e).split())})") from None
    except ValueError as e:
        raise FileRefused(f"{path}: {e}") from None
    return value


class StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader for files from elsewhere and sweep files: no aliases (an anchor 'bomb' expands into
    gigabytes), no nesting deeper than MAX_DEPTH (PyYAML composes by recursion), no key given twice,
    integers of at most MAX_INT_DIGITS digits, no float that is not finite."""

    _depth = 0
    check_numbers = True  # the sweep file's schema names its own fields' bounds (trial.timeout_min: ...)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError("while reading", None, "aliases (*name) are not supported", event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(
                "while reading", None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # a key given twice would silently keep the last value: `seq_len: 64` ... `seq_len: 128`
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise yaml.MarkedYAMLError(
                    "while reading",
                    None,
                    f"duplicate key {key!r} (line {key_node.start_mark.line + 1}; first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
            self._check_number(value_node, str(key))
        return super().construct_mapping(node, deep=deep)

    def construct_sequence(self, node: Any, deep: bool = False) -> Any:
        for i, item in enumerate(node.value):
            self._check_number(item, f"item {i + 1}")
        return super().construct_sequence(node, deep=deep)

    def _check_number(self, node: Any, field: str) -> None:
        """An integer too long to convert, or a float that is not finite (.inf, .nan, 1.0e+400)."""
        if not self.check_numbers or not isinstance(node, yaml.ScalarNode):
            return
        why = None
        if node.tag == "tag:yaml.org,2002:int" and len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            why = f"{field}: an integer of {len(node.value)} digits; at most {MAX_INT_DIGITS}"
        elif node.tag == "tag:yaml.org,2002:float" and not math.isfinite(self.construct_yaml_float(node)):
            why = f"{field}: {node.value[:20]} is not a finite number"
        if why:
            raise _OutOfBounds("while reading", None, why, node.start_mark)


# YAML 1.1 (PyYAML) reads `2e12` and `2.0e12` as strings: its float needs a dot and a signed
# exponent (`2.0e+12`), so `goal: {tokens: 2.0e12}` failed as "not a valid number"; YAML 1.2 and
# every other parser read them as floats, and so do we: 2e12, 2.0e12, 2.e12, .5e3, 1_000e3
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
StrictYamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


class _OutOfBounds(yaml.MarkedYAMLError):
    """A number the loader refuses: valid YAML, out of what a file from elsewhere may hold."""


class SweepYamlLoader(StrictYamlLoader):
    """The sweep file's loader: numbers are left to its schema, whose errors name the field's path."""

    check_numbers = False


def parse_yaml(text: str | bytes, source: str | Path, *, loader: type[StrictYamlLoader] = StrictYamlLoader) -> Any:
    """The YAML document of a file (see StrictYamlLoader); any problem is one FileRefused line naming
    the file, line and column (PyYAML's own text names `<unicode string>` and spans several lines)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileRefused(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except _OutOfBounds as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise FileRefused(f"{source}: {where}{e.problem}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = e.problem or e.context or "not valid YAML"
        if e.problem and e.context and e.context_mark:  # e.g. "while parsing a flow sequence" and where it began
            what += f" ({e.context} from line {e.context_mark.line + 1})"
        raise FileRefused(f"{source}: invalid YAML{where}: {' '.join(what.split())}") from None
    except yaml.YAMLError as e:
        raise FileRefused(f"{source}: invalid YAML: {' '.join(str(e).split())}") from None
