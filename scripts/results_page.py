"""The results tables — docs/results.md's and the README's — rendered from docs/results.json, one row per claim.

A row either states its figure (`result`, written by the benchmark that measured it: `record`, e.g.
`benchmarks/overhead.py --record`; older rows were copied from the benchmark's printed line) or names the saved
race it comes from (`race`: a race.json, pooled); a race row's figure is computed here from that file by the
race's own report functions — the same medians, seed-paired intervals, hit rates and finals `torchboost race`
prints — so it is never typed. Written by hand because no table tool reads our race files; the README holds the
rows marked `readme`. `python scripts/results_page.py` rewrites both tables; `--check` exits 1 when either file
differs from what the JSON gives (tests/test_results_page.py runs it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

from torchboost.race.report import (best_other, fmt_final_range, fmt_hits, fmt_interval, fmt_ratio, fmt_target,
                                    is_thor, ratio_interval, ratio_to_best_other, reach_key, summarize, verdict)
from torchboost.race.select import lanes_of, raced_targets, read_race

ROOT = Path(__file__).resolve().parents[1]
ROWS, PAGE, README = ROOT / "docs" / "results.json", ROOT / "docs" / "results.md", ROOT / "README.md"
BEGIN = "<!-- results table: rendered from docs/results.json by scripts/results_page.py -->"
END = "<!-- end results table -->"


def race_result(path: Path) -> str:
    """A confirmation's figure: the best THOR-family racer's median seconds to each target over the best other
    racer's, with the seed-paired 90% interval, the verdict it allows and both hit rates, then both finals."""
    data = read_race(path)
    summary = summarize(lanes_of(data, path), raced_targets(data["settings"], str(path)))
    targets = summary["targets"]
    thors = [n for n in summary["chosen_lr"] if is_thor(n)]
    thor = min(thors, key=lambda n: reach_key({float(t): rows[n] for t, rows in targets.items()}))
    parts, others = [], []
    for t, rows in targets.items():
        other = best_other(rows, thor)
        others.append(other)
        ratio, interval = ratio_to_best_other(rows, thor), ratio_interval(rows, thor)
        hits = f"hits {fmt_hits(rows[thor])} vs {fmt_hits(rows[other])}"
        if math.isnan(ratio):  # neither got there
            parts.append(f"to {fmt_target(t)}: neither {thor} nor {other} ({hits})")
            continue
        parts.append(f"to {fmt_target(t)}: {fmt_ratio(ratio)}{fmt_interval(interval)} {other}'s seconds, "
                     f"{verdict(ratio, interval)} ({hits})")
    finals = summary["final"]
    top = max((n for n in finals if not is_thor(n)), key=lambda n: finals[n]["median"])  # the best other final
    finals = ", ".join(f"{n} {fmt_final_range(finals[n])}" for n in dict.fromkeys([thor, *others, top]))
    return f"{thor}: " + "; ".join(parts) + f"; final top-1 {finals}"


def cells(row: dict) -> list[str]:
    result = race_result(ROOT / row["race"]) if "race" in row else row["result"]
    return [row["claim"], result, row["hardware"], row["command"], row["date"]]


def table(rows: list[dict], columns: int) -> str:
    head = ["claim", "result", "hardware", "command", "date"][:columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * columns]
    lines += ["| " + " | ".join(cells(r)[:columns]) + " |" for r in rows]
    return "\n".join(lines)


def render(text: str, body: str, where: Path) -> str:
    """`text` with the part between the markers replaced by `body`."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{where} has no results-table markers ({BEGIN} ... {END})")
    before, rest = text.split(BEGIN, 1)
    return before + BEGIN + "\n" + body + "\n" + END + rest.split(END, 1)[1]


def pages() -> dict[Path, str]:
    """What docs/results.md and the README hold once rendered from docs/results.json."""
    rows = json.loads(ROWS.read_text())["rows"]
    return {PAGE: render(PAGE.read_text(), table(rows, 5), PAGE),
            README: render(README.read_text(), table([r for r in rows if r.get("readme")], 4), README)}


def write_pages() -> None:
    for path, text in pages().items():
        if path.read_text() != text:
            path.write_text(text)


def record(claim: str, result: str, hardware: str, command: str) -> None:
    """A benchmark's measurement into docs/results.json (the row of `claim`, replaced, dated today; or a new row
    off the README), then both tables rendered again."""
    data = json.loads(ROWS.read_text())
    row = next((r for r in data["rows"] if r["claim"] == claim), None)
    if row is None:
        row = {"claim": claim, "readme": False}
        data["rows"].append(row)
    row.pop("race", None)
    row.update(result=result, hardware=hardware, command=command, date=datetime.date.today().isoformat())
    ROWS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    write_pages()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what the JSON gives")
    args = parser.parse_args(argv)
    if not args.check:
        write_pages()
        return 0
    stale = [path for path, text in pages().items() if path.read_text() != text]
    if stale:
        print(f"stale: {', '.join(str(p.relative_to(ROOT)) for p in stale)}: run python scripts/results_page.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
