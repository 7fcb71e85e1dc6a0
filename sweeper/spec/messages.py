"""pydantic's validation errors as the sweep file's messages: one line per problem, the dotted
field path, what is wrong and what is allowed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from sweeper.spec.schema import GPUSpec, HFConfigSpec, ModelSpec, SweepFile
from sweeper.trainers import RECIPES, recipes_taking

_UNION_BRANCH_MISMATCH = {"string_type", "model_type", "dict_type", "model_attributes_type", "list_type"}


def format_validation_error(e: ValidationError) -> str:
    """One line per problem: the dotted field path, then what is wrong and what is allowed."""
    entries = []
    for err in e.errors():
        parts = _path(err["loc"])
        loc = ".".join(parts)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = (
                _other_recipes_option(err["loc"]) or f"unknown field; allowed: {', '.join(_allowed_fields(err['loc']))}"
            )
            loc = "memory" if msg.startswith("memory.") else loc
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] in _NOT_A_MAPPING:
            msg = _not_a_mapping(err["loc"], err.get("input"))
        elif err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            key, tags = str(ctx.get("discriminator", "")).strip("'"), str(ctx.get("expected_tags", ""))
            loc = ".".join([*parts, key])
            msg = f"{ctx.get('tag')!r} not allowed; allowed: {tags.replace(chr(39), '')}"
        entries.append((loc, err["type"], msg))
    # A union (e.g. `model: preset | mapping`) reports a type mismatch for the branch the user
    # did not mean; drop it when the other branch has something specific to say.
    specific = [loc for loc, kind, _ in entries if kind not in _UNION_BRANCH_MISMATCH]
    lines = []
    for loc, kind, msg in entries:
        if kind in _UNION_BRANCH_MISMATCH and any(o == loc or o.startswith(loc + ".") for o in specific):
            continue
        if not loc or msg.startswith((loc + ".", loc + ":")):
            lines.append(msg)
        else:
            lines.append(f"{loc}: {msg}")
    return "; ".join(dict.fromkeys(lines))


# pydantic's "Input should be a valid dictionary or instance of SpaceSpec": a section given as
# nothing (`space:`), a list or a scalar where the file needs a mapping of fields
_NOT_A_MAPPING = {"model_type", "dict_type", "model_attributes_type"}


def _not_a_mapping(loc: tuple[Any, ...], given: Any) -> str:
    """What the section must hold, its fields, and what it holds instead."""
    fields = ", ".join(_allowed_fields((*loc, "")))
    what = "a mapping of knob: [values]" if _path(loc) == ["space"] else "a mapping of fields"
    got = "nothing" if given is None else ("a list" if isinstance(given, list) else repr(given))
    return f"must be {what} ({fields}), got {got}"


def _path(loc: tuple[Any, ...]) -> list[str]:
    """The field path as the file spells it: without pydantic's union branch names."""
    return [_shown(p) for i, p in enumerate(loc) if not _is_union_tag(p) and not _is_recipe_tag(loc, i)]


def _shown(part: Any) -> str:
    # a key of the file as written, quoted when it holds a line break or other unprintable text
    # (a message is one line)
    text = str(part)
    return text if text.isprintable() else repr(text)


def _is_recipe_tag(loc: tuple[Any, ...], i: int) -> bool:
    # `memory` is a union told apart by recipe: pydantic names the branch after `memory`
    return i > 0 and loc[i - 1] == "memory" and loc[i] in RECIPES


def _other_recipes_option(loc: tuple[Any, ...]) -> str | None:
    """For a `memory:` option of another recipe than the one in effect: which recipes take it."""
    if len(loc) != 3 or not _is_recipe_tag(loc, 1):
        return None
    takers = recipes_taking(str(loc[2]))
    if not takers:
        return None
    which = f"recipe {takers[0]}" if len(takers) == 1 else f"recipes {', '.join(takers[:-1])} and {takers[-1]}"
    return f"memory.{loc[2]} applies to {which} only, not {loc[1]!r}"


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in {"str", "int", "bool", "float"} or "[" in part or part in _TAGGED)


# the union branches pydantic names in an error's path, by the class each one validates with
_TAGGED: dict[str, type[BaseModel]] = {"ModelSpec": ModelSpec, "GPUSpec": GPUSpec, "HFConfigSpec": HFConfigSpec}


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = SweepFile
    for i, part in enumerate(loc[:-1]):
        if _is_recipe_tag(loc, i):
            model = RECIPES[str(part)].options
            continue
        if part in _TAGGED:  # the branch of a union the value was checked as
            model = _TAGGED[part]
            continue
        if _is_union_tag(part):
            continue
        info = model.model_fields.get(str(part))
        if info is None:
            break
        inner = _pydantic_class(info.annotation)
        if inner is None:
            if i + 1 < len(loc) - 1 and loc[i + 1] in _TAGGED:  # a tagged union: its branch comes next
                continue
            break
        model = inner
    return list(model.model_fields)


def _pydantic_class(annotation: Any) -> type[BaseModel] | None:
    candidates = getattr(annotation, "__args__", (annotation,))
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None
