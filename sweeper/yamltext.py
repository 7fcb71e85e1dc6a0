"""Reading YAML the one way every file of the tool is read: sweep files, launcher profiles,
measured and learned profiles.

What it adds to PyYAML's SafeLoader, and why:
- numbers as people write them: YAML 1.1 (PyYAML) reads `2e12` and `2.0e12` as strings (its float
  needs a dot and a signed exponent: `2.0e+12`), so `goal: {tokens: 2.0e12}` would fail as a
  "valid number" error; YAML 1.2 and every other parser read them as floats. `1_000_000` is
  already an int in YAML 1.1.
- no aliases (an anchor "bomb" would expand into gigabytes), no nesting deeper than MAX_DEPTH
  (PyYAML composes by recursion: a kilobyte of brackets would end thousands of frames deep), no
  key given twice (the last value would win silently).
- a problem is one line naming the line and column (PyYAML's own text names `<unicode string>`
  and spans several lines), raised as the caller's error type so the caller words its file.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from sweeper.errors import SpecError, SweepError

# a sweep file nests a few levels (model: moe: ...); a profile a few more (tables: gemm: rows)
MAX_DEPTH = 32

# a float with an exponent and no dot or an unsigned exponent: 2e12, 2.0e12, 2.e12, .5e3, 1_000e3
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """SafeLoader with the exponent floats above, refusing aliases, deep nesting and duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                "while reading the file", None, "aliases (*name) are not supported", event.start_mark
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(
                "while reading the file",
                None,
                f"nested more than {MAX_DEPTH} levels deep (a sweep file needs a few)",
                self.peek_event().start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = key_node.value
            if key in seen:
                raise yaml.MarkedYAMLError(
                    "while reading the file",
                    None,
                    f"duplicate key {key!r} (line {key_node.start_mark.line + 1}; first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def load_yaml(text: str | bytes, source: str, *, error: type[SweepError] = SpecError) -> Any:
    """The YAML document of `text` (from `source`, a path or a name for messages); a problem is one
    `error` line: `SOURCE: invalid YAML at line L, column C: what`."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = e.problem or e.context or "not valid YAML"
        if e.problem and e.context and e.context_mark:  # e.g. "while parsing a flow sequence" and where it began
            what += f" ({e.context} from line {e.context_mark.line + 1})"
        raise error(f"{source}: invalid YAML{where}: {' '.join(what.split())}") from None
    except yaml.YAMLError as e:
        raise error(f"{source}: invalid YAML: {' '.join(str(e).split())}") from None
