"""The one rule language for options: dataclass fields that carry their own rules, and the checks.

A field is declared with `option(default, choices=..., ge=..., gt=..., le=..., lt=...)`; the rules live in
the dataclass field's metadata. A field declared with `sections(...)` holds named option sections (name ->
options dataclass instance) that a config writes flat in its parent (`optim.thor.frequency`), so a registry
can add a section without a field of its own. The recipe config, THOR's options, every optimizer's options and boost's
per-algorithm options are all declared this way, so one checker produces one kind of error message, and
`--print-config`, docs and the bad-value test sweep read one schema instead of parallel hand-written lists.
It lives in the library (not in `recipe/`) so that library classes can check their own options.
Written by hand because the needs are small (a dozen types, four bounds) and the error texts must be
ours; pydantic would add a dependency for the same result.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import field
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

from torchboost.errors import ConfigError, suggest
from torchboost.plaindata import ascii_number, check_number, shown_number

_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b),
           "le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
           choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None, help: str = "",
           **bounds: float) -> Any:
    """A dataclass field with rules: `choices` (allowed values; or a function returning them, read at each
    check, for a registry that can grow after the class is defined) and bounds `ge`/`gt`/`le`/`lt` (numbers,
    or every number of a list). Numbers must also be finite. `help`: one line of meaning, shown by
    `torchboost options` and docs/CONFIG.md."""
    unknown = set(bounds) - set(_BOUNDS)
    if unknown:
        raise TypeError(f"unknown rule(s) {sorted(unknown)}")
    meta = {"choices": choices if choices is None or callable(choices) else tuple(choices), "help": help, **bounds}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def sections(factory: Callable[[], dict[str, Any]], help: str = "") -> Any:
    """A field of named option sections, {name: options dataclass instance}, written flat in the parent
    (`optim: {thor: {...}}`, not `optim: {sections: {thor: {...}}}`): `leaf_fields` yields their fields as
    `PARENT.NAME.FIELD` and `plain` writes them so. `factory` returns every section with its defaults."""
    return field(default_factory=factory, metadata={"sections": True, "help": help})


def is_sections(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("sections"))


def choices_of(f: dataclasses.Field) -> tuple[Any, ...] | None:
    """A field's allowed values (None: any), calling the function given as `choices` if it was one."""
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def _number(b: float) -> str:
    return str(b) if isinstance(b, int) else f"{b:g}"


def describe_rules(f: dataclasses.Field) -> str:
    """'one of a, b' / '>= 0 and < 1' / '' for a field's rules (used in error messages and docs)."""
    meta = f.metadata
    choices = choices_of(f)
    if choices:
        return "one of " + ", ".join(str(c) for c in choices)
    parts = [f"{_BOUNDS[k][0]} {_number(meta[k])}" for k in _BOUNDS if meta.get(k) is not None]
    return " and ".join(parts)


KIND_WORDS = {int: "an integer", float: "a numeric", bool: "a true/false", str: "a text"}


def check_type(value: Any, tp: Any, where: str) -> Any:
    """`value` checked against a field type (the few shapes our dataclasses use); int -> float coerced. A
    number for an int or float key must be in float range (`plaindata.check_number`), whatever its source."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return check_type(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}", f"write e.g. {where}=[1, 2]")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [check_type(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}", f"write e.g. {where}={{key: value}}")
        return value
    if tp in (int, float):
        check_number(value, where)  # before float(): an int past 1.8e308 would be an OverflowError
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string; users write it
        try:
            number = ascii_number(value)  # '٠.١' is refused here as train.epochs=٣ is (YAML reads neither)
        except ValueError:
            pass
        else:
            check_number(number, where, written=value)
            return number
    # bool is a subclass of int: `epochs: true` must not pass as 1.
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where} must be {tp.__name__}, got {type(value).__name__} {value!r}",
                          f"give {KIND_WORDS.get(tp, f'a {tp.__name__}')} value")
    return value


def check_rules(value: Any, f: dataclasses.Field, where: str) -> None:
    """Apply a field's choices and bounds to a type-checked value (None = unset, always allowed)."""
    if value is None:
        return
    meta = f.metadata
    choices = choices_of(f)
    for v in (value if isinstance(value, list) else [value]) if choices else ():
        if v not in choices:  # a list field's choices apply to each item
            raise ConfigError(f"{where}={v!r} is not one of {', '.join(str(c) for c in choices)}",
                              suggest(str(v), [str(c) for c in choices]))
    numbers = value if isinstance(value, list) else [value]
    for v in numbers:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        check_number(v, where, describe_rules(f))
        for key, (sign, ok) in _BOUNDS.items():
            bound = meta.get(key)
            if bound is not None and not ok(v, bound):
                raise ConfigError(f"{where} must be {describe_rules(f)}, got {shown_number(v)}",
                                  f"set {where} {sign} {_number(bound)}")


def leaf_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any, Any]]:
    """(dotted key, field, type hint, value) of every non-section field of a config tree, in order. The
    sections of a `sections` field are walked as if they were fields of the parent; a section given as a
    mapping (in Python) is one leaf of type dict, left to the check of whoever owns that section."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if is_sections(f):
            for name, section in value.items():
                if dataclasses.is_dataclass(section):
                    yield from leaf_fields(section, f"{prefix}{name}.")
                else:
                    yield f"{prefix}{name}", f, dict, section
        elif dataclasses.is_dataclass(value):
            yield from leaf_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, hints[f.name], value


def plain(obj: Any) -> Any:
    """A config tree as plain data (dicts, lists, scalars; what a YAML file holds), with the sections of a
    `sections` field written flat in their parent: the inverse of reading the tree from a file."""
    if not dataclasses.is_dataclass(obj):
        return copy.deepcopy(obj)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if is_sections(f):
            out.update({name: plain(section) for name, section in value.items()})
        else:
            out[f.name] = plain(value)
    return out


def check_options(values: Mapping[str, Any], cls: type, where: str) -> dict[str, Any]:
    """`values` checked against the options dataclass `cls`: unknown keys (with the closest valid one), types
    and rules. Returns the type-checked values (ints coerced to floats where a float is declared)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of options, got {type(values).__name__} {values!r}",
                          f"write e.g. {where}={{key: value}}")
    fields_ = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    checked = {}
    for key, value in values.items():
        if key not in fields_:
            raise ConfigError(f"unknown option {where}.{key}", suggest(str(key), list(fields_)))
        checked[key] = check_type(value, hints[key], f"{where}.{key}")
        check_rules(checked[key], fields_[key], f"{where}.{key}")
    return checked


def check_fields(obj: Any, where: str) -> None:
    """Check every field of an options dataclass instance against its declared type and rules (for a
    `__post_init__`: an instance built in Python gets the same one-line errors as one read from a recipe)."""
    check_options({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, type(obj), where)
