"""Bounded reading of plain data from untrusted places: YAML recipes and `--set` values, and the configs
stored inside checkpoints.

PyYAML's SafeLoader runs no code but lets a 500-byte file expand an alias ten ways nine levels deep (a
billion references), recurse 20,000 levels into Python's stack, and silently keep the last of two duplicate
keys. A recipe needs none of that: aliases are refused, nesting is capped, a duplicate key is an error. A
checkpoint's saved config comes from `torch.load(weights_only=True)`, whose memo can share one list from
many places just the same; `check_plain` walks it with a budget before anything iterates it.

Numbers: every number a config key takes is a float or an int a float can hold. An int past ±1.8e308 is an
OverflowError wherever it meets a float (`math.isfinite`, `float()`), and Python refuses to parse or print an
int of over 4,300 digits (a ValueError; parsing one is quadratic). `in_float_range` is the one test and
`check_number` the one refusal (`options.check_type` applies it to every int and float key, whatever the
source); YAML (and JSON through `json_int`) keeps an integer written with more than `MAX_NUMBER_CHARS`
characters, or a float that overflows, as an `OutOfRange` (±inf, shown as written) instead of parsing it;
`check_plain` refuses an int past the range anywhere in a saved config.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import yaml

from torchboost.errors import ConfigError

MAX_DEPTH = 32  # recipes are 3 levels deep; boost's MindSpore dict 4
MAX_NODES = 100_000  # values in one recipe or saved config, counted with repetition
MAX_BYTES = 1 << 20  # a recipe is a few kB
FLOAT_MAX = sys.float_info.max  # 1.8e308
MAX_NUMBER_CHARS = 330  # FLOAT_MAX has 309 digits: a decimal integer written longer is past it


def in_float_range(value: int | float) -> bool:
    """`value` is finite and a float can hold it (comparing an int with a float is exact in Python and
    never overflows; NaN compares false)."""
    return -FLOAT_MAX <= value <= FLOAT_MAX


def shown_number(value: Any, width: int = 24) -> str:
    """A number (or the text of one) for a message: a long one cut, with its digit count; an int past
    Python's limit on printing digits as its order of magnitude."""
    value = value.text if isinstance(value, OutOfRange) else value
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # str() of an int of over 4,300 digits
        return f"{'-' if value < 0 else ''}1e{int(abs(value).bit_length() * math.log10(2))} (or so)"
    return text if len(text) <= width else f"{text[:12]}…({len(re.sub(r'[^0-9a-fA-F]', '', text)):,} digits)"


class OutOfRange(float):
    """A number from YAML that no float holds (an integer of over MAX_NUMBER_CHARS characters, 1e999): ±inf,
    so every finite check refuses it, shown as it was written."""

    def __new__(cls, text: str) -> OutOfRange:
        number = super().__new__(cls, "-inf" if text.lstrip().startswith("-") else "inf")
        number.text = text
        return number

    def __repr__(self) -> str:
        return shown_number(self.text)

    __str__ = __repr__

    def __reduce__(self) -> tuple:  # copied (a config's deepcopy) as the text it was written as
        return OutOfRange, (self.text,)


def json_int(text: str) -> int | float:
    """`json.loads`'s parse_int with YAML's rule: an integer written too long to be in range is an OutOfRange,
    never parsed (past 4,300 digits int() refuses it)."""
    return OutOfRange(text) if len(text) > MAX_NUMBER_CHARS else int(text)


def ascii_number(text: str, kind: type[int] | type[float] = float) -> int | float:
    """`kind(text)` when `text` is written in ASCII: the one rule for numbers read from text (flags, `--set`,
    recipes, lr grids, budgets). int() and float() also read other scripts' digits ('٣' is 3) and isdigit()
    passes '²', which int() refuses: a number is written 0-9. ValueError otherwise."""
    if not text.isascii():
        raise ValueError(f"{text[:40]!r} is not written in ASCII digits")
    return kind(text)


def load_json(raw: bytes | str) -> Any:
    """JSON from an untrusted file, its integers read by `json_int` (5,000 digits: kept unparsed, never a
    ValueError deep in a caller): a ValueError with a short reason when it is not UTF-8 JSON or is nested past
    the parser's stack (a 100,000-deep list is a RecursionError in `json.loads`)."""
    try:
        return json.loads(raw, parse_int=json_int)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("nested too deep") from None


def check_number(value: Any, where: str, rules: str = "", written: Any = None) -> None:
    """ConfigError unless `value`, an int or float (anything else passes), is in float range
    (`in_float_range`): `where=<value as written> is not a finite number in range`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not in_float_range(value):
        raise ConfigError(f"{where}={shown_number(value if written is None else written)} is not a finite number "
                          "in range", f"give a finite value ({rules})" if rules else
                          f"give a finite value within ±{FLOAT_MAX:.1e}")


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases, with a depth cap and duplicate keys refused."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"YAML aliases (*{event.anchor}) are not allowed in recipes{_where(event)}")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep{_where(self.peek_event())}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        text = self.construct_scalar(node)
        if len(text) > MAX_NUMBER_CHARS:  # never parsed: past the float range, and maybe Python's digit limit
            return OutOfRange(text)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> Any:
        value = super().construct_yaml_float(node)
        if math.isinf(value) and "inf" not in self.construct_scalar(node).lower():  # 1e999, not .inf
            return OutOfRange(self.construct_scalar(node))
        return value

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if duplicate:
                raise yaml.YAMLError(f"the key {key!r} appears twice in one mapping{_where(key_node)} (the first "
                                     "would be silently dropped)")
        return super().construct_mapping(node, deep)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)


def _where(mark_holder: Any) -> str:
    mark = getattr(mark_holder, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def load_yaml(text: str, what: str) -> Any:
    """Plain data from YAML text, bounded (see the module docstring); ConfigError naming `what` otherwise."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ConfigError(f"{what} is over {MAX_BYTES >> 10} kB", "a recipe is a few kB of YAML; check the file")
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - BoundedLoader is a SafeLoader
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{what} is not valid YAML for a recipe: {first}", "fix the YAML") from None


def check_plain(obj: Any, what: str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> None:
    """Refuse data that is not plain (dict/list/tuple of str, numbers, bools, None) or too big to walk:
    counted with repetition, so a list shared from many places costs what walking it would."""
    budget = [max_nodes]

    def walk(o: Any, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError(f"{what} holds more than {max_nodes:,} values", "it is not a torchboost config")
        if depth > max_depth:
            raise ConfigError(f"{what} is nested more than {max_depth} levels deep", "it is not a torchboost config")
        if isinstance(o, dict):
            for k, v in o.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v, depth + 1)
        elif not (o is None or isinstance(o, (str, int, float, bool))):
            raise ConfigError(f"{what} holds a {type(o).__name__} where plain data belongs",
                              "it is not a torchboost config")
        elif isinstance(o, int) and not in_float_range(o):  # a float would overflow on it; str() may refuse it
            raise ConfigError(f"{what} holds the number {shown_number(o)}, past the float range",
                              "it is not a torchboost config")

    walk(obj, 0)
