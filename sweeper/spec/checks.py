"""Checks of a sweep file that need more than a field's type: the size of the cross product
(before anything is allocated) and the external workload's command, environment and folder."""

from __future__ import annotations

import math
import re
import shlex
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeper.errors import SpecError
from sweeper.knobs import KNOBS

# what sweeper.runtime.workloads.placeholders fills in, besides every knob; {flags} is a word of its own
PLACEHOLDERS = frozenset(
    {
        "dp",
        "grad_accum",
        "global_batch_size",
        "seq_len",
        "steps",
        "nproc",
        "nnodes",
        "world",
        "node_rank",
        "master_addr",
        "master_port",
        "workdir",
        "flags",
        *KNOBS,
    }
)
ENV_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_")


def check_layout_count(space: Mapping[str, tuple[Any, ...]], cap: int) -> None:
    """The cross product of the space, refused over `cap` with its size and the widest knobs."""
    n = math.prod(len(v) for v in space.values())
    if n <= cap:
        return
    widest = sorted(((len(v), k) for k, v in space.items() if len(v) > 1), reverse=True)[:3]
    names = ", ".join(f"{k} ({c} values)" for c, k in widest)
    raise SpecError(
        f"space: {n:,} layouts (the product of every knob's values), more than the {cap:,} a plan "
        f"may hold; narrow the knobs with the most values: {names}"
    )


def check_workload(command: str, env: Mapping[str, str], cwd: str | None) -> None:
    """Placeholders the trial can fill, environment names a process can have, a folder that exists."""
    if command.strip():
        try:
            words = shlex.split(command)
        except ValueError as e:
            raise ValueError(f"workload.command: cannot split it like a shell line: {e}") from None
        for word in words:
            if word != "{flags}":
                check_placeholders(word)
    for name in env:
        if not name or name[0].isdigit() or not set(name) <= ENV_NAME_CHARS:
            raise ValueError(f"workload.env: {name!r} is not an environment variable name (letters, digits, '_')")
    if cwd is not None and not Path(cwd).expanduser().is_dir():
        raise ValueError(f"workload.cwd: {cwd!r} is not an existing folder")


def check_placeholders(word: str) -> None:
    """Each field of one word of the command is a plain {name} of a known name: `str.format` would
    otherwise read attributes ({nproc.foo}), index ({tp[5]}) or pad to any width ({nproc:>99999999999})
    in every trial, long after the dry run said the file was fine."""
    allowed = ", ".join(sorted(PLACEHOLDERS))
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(word) if f is not None]
    except ValueError as e:
        raise ValueError(f"workload.command: bad braces in {word!r}: {e}") from None
    for name, spec, conv in fields:
        shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
        if name == "flags":
            raise ValueError(f"workload.command: {{flags}} must be a word of its own, not part of {word!r}")
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if base not in PLACEHOLDERS:
            raise ValueError(f"workload.command: unknown placeholder {shown} in {word!r}; allowed: {allowed}")
        if spec or conv or base != name:
            raise ValueError(
                f"workload.command: placeholder {shown} in {word!r} must be a plain {{{base}}} (no attribute, index, "
                f"conversion or format spec); allowed: {allowed}"
            )
