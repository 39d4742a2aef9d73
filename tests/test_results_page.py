"""The results tables (docs/results.md's and the README's) are rendered from docs/results.json
(`scripts/results_page.py`): both files hold exactly what the JSON gives, a race row's figure is computed from its
saved race by the race's own report and equals a hand computation on the same runs, and every row states its
threads or its GPU."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import results_page  # noqa: E402


def test_both_tables_are_what_the_results_file_gives():
    assert results_page.main(["--check"]) == 0, "run python scripts/results_page.py"
    rows = json.loads(results_page.ROWS.read_text())["rows"]
    assert sum(bool(r.get("readme")) for r in rows) >= 5
    for row in rows:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row["claim"]
        assert ("race" in row) != ("result" in row), row["claim"]  # a figure is typed or computed, never both
        if "race" in row:
            assert (ROOT / row["race"]).is_file(), row["race"]


def test_every_row_states_its_threads_or_its_gpu():
    """A CPU figure depends on its thread count (2 threads on 2 busy cores run 2.5x slower); a GPU row names
    the GPU."""
    for row in json.loads(results_page.ROWS.read_text())["rows"]:
        assert re.search(r"\b\d+ threads?\b", row["hardware"]) or "NVIDIA" in row["hardware"], row["claim"]


def race_file(tmp_path: Path) -> Path:
    """Three seeds of THOR, a THOR variant, Muon and SGD, evaluated once a second; THOR at 0.9 by seconds
    (2, 3, 2), Muon (3, 3, 4), SGD never; the variant slower than THOR."""
    curves = {"thor": [[0.5, 0.9, 0.95], [0.5, 0.6, 0.9], [0.7, 0.92, 0.93]],
              "thor[damping_mode=trace]": [[0.5, 0.6, 0.9], [0.5, 0.6, 0.91], [0.5, 0.8, 0.9]],
              "muon": [[0.5, 0.6, 0.9], [0.6, 0.7, 0.91], [0.5, 0.6, 0.8, 0.92]], "sgd": [[0.5, 0.6, 0.7]] * 3}
    runs = [{"optimizer": name, "lr": 0.1, "seed": seed, "stopped": "epoch budget",
             "history": [{"epoch": i + 1, "seconds": float(i + 1), "val_top_1_accuracy": a} for i, a in enumerate(c)]}
            for name, per_seed in curves.items() for seed, c in enumerate(per_seed)]
    path = tmp_path / "race.json"
    path.write_text(json.dumps({"settings": {"recipe": "r", "overrides": [], "targets": [0.9], "first_seed": 0,
                                             "seeds": 3, "epochs": 3}, "summary": {}, "runs": runs}))
    return path


def test_a_race_rows_figure_is_the_hand_computed_one(tmp_path):
    text = results_page.race_result(race_file(tmp_path))
    ratio = statistics.median([2, 3, 2]) / statistics.median([3, 3, 4])  # the hold rule: reached and held
    assert text.startswith(f"thor: to 90%: {ratio:.2f}x [")  # the fastest THOR-family racer, vs the best other
    assert "muon's seconds" in text and "(hits 3/3 vs 3/3)" in text
    assert "final top-1 thor 93.0% [90.0%, 95.0%], muon 91.0% [90.0%, 92.0%]" in text


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_a_benchmark_records_its_row_and_both_tables_follow(tmp_path, monkeypatch):
    """`record` (what `benchmarks/overhead.py --record` calls) replaces the claim's row, dated today, and renders
    the page and the README again from the JSON."""
    import datetime
    import shutil

    for name in ("ROWS", "PAGE", "README"):
        copy = tmp_path / getattr(results_page, name).name
        shutil.copy(getattr(results_page, name), copy)
        monkeypatch.setattr(results_page, name, copy)
    claim = "framework overhead: `Model.train` vs a hand-written loop"
    results_page.record(claim, "0.990× (target ≤ 1.03)", "2 CPU cores, 1 thread", "`python benchmarks/overhead.py`")
    row = next(r for r in json.loads(results_page.ROWS.read_text())["rows"] if r["claim"] == claim)
    assert row["date"] == datetime.date.today().isoformat() and row["readme"]
    for page in (results_page.PAGE, results_page.README):
        assert f"| {claim} | 0.990× (target ≤ 1.03) | 2 CPU cores, 1 thread |" in page.read_text()
    assert results_page.main(["--check"]) == 0
