"""How many names a brace pattern stands for, counted without making them.

braceexpand (the package webdataset uses, and shard patterns expand with) builds every range whole before
yielding a name: `train-{000000000..999999999}.tar` would take minutes and gigabytes before any limit applied
to its output could refuse it. No library counts a pattern, so this walks braceexpand's own grammar (v0.1.7)
and multiplies instead of expanding: a pattern is a product of literals and {...} items; an item is an
integer or letter range, a comma sequence of patterns (summed), or else literal braces around a pattern.
`tests/test_trust.py` checks the count against braceexpand's expansion on generated patterns.
"""

from __future__ import annotations

import re

from braceexpand import UnbalancedBracesError, alphabet

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")


def count_names(pattern: str, max_depth: int = 32, cap: int = 10**7) -> int:
    """The number of names `braceexpand(pattern)` yields, or some number above `cap` once it is known to be
    (counting stops there). UnbalancedBracesError as braceexpand raises it; ValueError for braces nested
    deeper than `max_depth` or a range bound too long for int()."""
    return _pattern(pattern, 0, max_depth, cap)


def _pattern(pattern: str, depth: int, max_depth: int, cap: int) -> int:
    if depth > max_depth:
        raise ValueError(f"it nests braces over {max_depth} deep")
    total, start, level, pos = 1, 0, 0, 0
    while pos < len(pattern):
        c = pattern[pos]
        if c == "\\":  # an escaped character is a literal
            pos += 2
            continue
        if c == "{":
            level += 1
            start = pos if level == 1 else start
        elif c == "}":
            level -= 1
            if level == 0:
                total *= _item(pattern[start + 1:pos], depth + 1, max_depth, cap)
                if total > cap:
                    return total
        pos += 1
    if level != 0:
        raise UnbalancedBracesError(f"Unbalanced braces: '{pattern}'")
    return total


def _item(expr: str, depth: int, max_depth: int, cap: int) -> int:
    m = _INT_RANGE.match(expr) or _CHAR_RANGE.match(expr)
    if m:
        step = (int(m[3]) or 1) if m[3] else 1
        a, b = (int(m[1]), int(m[2])) if m.re is _INT_RANGE else (alphabet.index(m[1]), alphabet.index(m[2]))
        return abs(b - a) // step + 1
    parts, start, level, pos = [], 0, 0, 0
    while pos < len(expr):
        c = expr[pos]
        if c == "\\":
            pos += 2
            continue
        level += (c == "{") - (c == "}")
        if c == "," and level == 0:
            parts.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if level != 0 or not parts:  # not a sequence: literal braces around a pattern
        return _pattern(expr, depth, max_depth, cap)
    return sum(_pattern(p, depth, max_depth, cap) for p in [*parts, expr[start:]])
