"""The README's results table quotes docs/results.md: every row's figure, hardware and command are the results
page's for the same claim (one place per claim), and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The data rows' cells of the first Markdown table at or after `heading` (its header and rule dropped)."""
    rows = []
    for line in text[text.index(heading):].splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]


def test_every_readme_result_is_the_results_pages_figure():
    readme = table_rows((ROOT / "README.md").read_text(), "## Results")
    page = {row[0]: row for row in table_rows((ROOT / "docs" / "results.md").read_text(), "| claim |")}
    assert len(readme) >= 5
    for claim, result, hardware, command in readme:
        assert claim in page, f"README claim not on the results page: {claim}"
        assert page[claim][1:4] == [result, hardware, command], claim
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", page[claim][4]), f"no date for {claim}"


def test_every_row_states_its_threads_or_its_gpu():
    """The page promises the thread count of each row: a CPU figure depends on it (2 threads on 2 busy cores
    run 2.5x slower); a GPU row names the GPU."""
    for claim, _, hardware, *_ in table_rows((ROOT / "docs" / "results.md").read_text(), "| claim |"):
        assert re.search(r"\b\d+ threads?\b", hardware) or "NVIDIA" in hardware, (claim, hardware)


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
