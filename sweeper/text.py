"""Text from elsewhere (a trial's error, a config.json field, a profile's device name, a file name)
is data, never markup, code or a terminal command: one function per medium makes it so, and every
place that prints or writes such a string goes through the one of its medium.

- `for_terminal`: control characters (escape sequences, carriage returns, bells) shown as `\\x1b`..
- `for_markup`: the same, then rich markup escaped (`[/path]` printed, not parsed as a tag)
- `for_comment`: for a `#` comment or a one-line message: newlines shown as `\\n`, so no text ends the line
- `toml_string`: a TOML basic string; `shell_word`: a POSIX shell word; `yaml_text`: a YAML document;
  `html_text`: HTML text or attribute
"""

from __future__ import annotations

import html
import re
import shlex
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls (ESC, CSI and OSC start terminal commands),
# and the Unicode line and paragraph separators a terminal may break on
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _shown(m: re.Match[str]) -> str:
    c = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
    )


def for_terminal(text: object) -> str:
    """`text` with every control character but tab and newline written out (`\\x1b`), so it can
    move no cursor, clear no line, set no colour and open no hyperlink."""
    return _CONTROL.sub(_shown, str(text))


def for_comment(text: object) -> str:
    """`text` as one line: every control character, newlines and tabs included, written out."""
    return _CONTROL_OR_NEWLINE.sub(_shown, str(text))


def for_markup(text: object) -> str:
    """`text` inside a rich markup string: printed as it is ([bold] stays `[bold]`), no control codes."""
    from rich.markup import escape

    return escape(for_terminal(text))


def toml_string(text: str) -> str:
    """A TOML basic string ("..."): quotes, backslashes and every control character escaped."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + _CONTROL_OR_NEWLINE.sub(lambda m: _toml_escape(m.group()), out) + '"'


def _toml_escape(c: str) -> str:
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}.get(c) or f"\\u{ord(c):04X}"


def shell_word(text: str) -> str:
    """One POSIX shell word, whatever `text` holds (a newline stays inside the quotes)."""
    return shlex.quote(text)


def yaml_text(data: Any) -> str:
    """A YAML document of plain data, by the YAML writer (a string is quoted where it must be)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def html_text(text: object) -> str:
    """HTML text or a quoted attribute's value: <, >, &, and both quotes escaped."""
    return html.escape(str(text), quote=True)
