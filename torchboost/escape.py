"""Names read from files (class folders, a checkpoint's or an ONNX model's class list, image paths) are data
wherever they are written. One rule per sink:

- terminal and logs: `errors.printable` (control, format and line-separator characters, lone surrogates of
  names that are not UTF-8, written as escapes: one line, no terminal controls);
- CSV cells: `csv_cell` (printable, and a cell a spreadsheet would run as a formula made text);
- JSON: `json.dumps` with its default `ensure_ascii`: every control and non-ASCII character is an escape;
- plot labels: `plot_label` (printable, and matplotlib's `$` math markers made literal), so matplotlib neither
  fails on a name nor prints its characters in a warning.
"""

from __future__ import annotations

from torchboost.errors import printable

FORMULA = ("=", "+", "-", "@")  # what makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)


def csv_cell(text: object) -> str:
    """`text` as a CSV cell: printable, with a leading ' when it would start a formula (`=cmd|' /C calc'!A0`)."""
    text = printable(text)
    return "'" + text if text.startswith(FORMULA) else text


def plot_label(text: object) -> str:
    """`text` as a matplotlib label: printable, `$` escaped (a pair would be parsed as math, and bad math fails
    the figure)."""
    return printable(text).replace("$", r"\$")
