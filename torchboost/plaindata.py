"""Bounded reading of plain data from untrusted places: YAML recipes and `--set` values, and the configs
stored inside checkpoints.

PyYAML's SafeLoader runs no code but lets a 500-byte file expand an alias ten ways nine levels deep (a
billion references), recurse 20,000 levels into Python's stack, and silently keep the last of two duplicate
keys. A recipe needs none of that: aliases are refused, nesting is capped, a duplicate key is an error. A
checkpoint's saved config comes from `torch.load(weights_only=True)`, whose memo can share one list from
many places just the same; `check_plain` walks it with a budget before anything iterates it.
"""

from __future__ import annotations

from typing import Any

import yaml

from torchboost.errors import ConfigError

MAX_DEPTH = 32  # recipes are 3 levels deep; boost's MindSpore dict 4
MAX_NODES = 100_000  # values in one recipe or saved config, counted with repetition
MAX_BYTES = 1 << 20  # a recipe is a few kB


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

    walk(obj, 0)
