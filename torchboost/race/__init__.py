"""The optimizer race: one recipe, several optimizers, time to accuracy, raced fairly (`lanes`), tabulated
(`report`), written and drawn (`plot`), traced per layer (`trace`); selected on a held-out split and confirmed on
the test split (`select`) under the test split's ledger (`ledger`); racer names read once (`names`); the flows
callable from Python (`run`: `race(RaceRequest)`, what `torchboost race` calls). It builds its runs with
`recipe/`, which never imports it.
"""

from torchboost.race.run import RaceRequest, race

__all__ = ["RaceRequest", "race"]
