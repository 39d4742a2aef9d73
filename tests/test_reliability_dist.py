"""Issue 15: ranks started with different settings stop together, each with a DistributedError naming the
keys that differ, before any rank trains or writes into the output folder (2 gloo ranks, the real
`train_from_config` of the application layer)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from torchboost.distributed import launch

pytestmark = pytest.mark.dist


def _rank_with_its_own_overrides(out: str, overrides_by_rank: list[list[str]]) -> dict:
    """Train digits-lenet with this rank's overrides; return what stopped it (never raise: the parent
    compares both ranks' outcomes)."""
    from torchboost.errors import TorchboostError
    from torchboost.recipe.load import load_config
    from torchboost.recipe.run import train_from_config

    rank = int(os.environ["RANK"])
    cfg = load_config("digits-lenet", ["train.progress_bar=false", "train.epochs=1", *overrides_by_rank[rank]])
    start = time.monotonic()
    try:
        train_from_config(cfg, output=out, log=lambda msg: None)
    except TorchboostError as e:
        return {"error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}
    return {"error": "", "message": "trained", "seconds": time.monotonic() - start}


@pytest.mark.parametrize("overrides,keys", [
    ([["data.batch_size=32"], ["data.batch_size=16"]], ["data.batch_size"]),
    ([["train.epochs=1"], ["train.epochs=2"]], ["train.epochs"]),
    ([["data.batch_size=32", "train.epochs=1"], ["data.batch_size=16", "train.epochs=2"]],
     ["data.batch_size", "train.epochs"]),
], ids=["batch_size", "epochs", "both"])
@pytest.mark.slow
def test_ranks_that_disagree_stop_together_naming_the_keys(tmp_path: Path, overrides, keys):
    out = tmp_path / "run"
    # together, within 120 s: no rank waits for a collective until a timeout (launch kills both past it and
    # raises DistributedError, so a hang fails here rather than after it ends)
    results = launch(_rank_with_its_own_overrides, 2, str(out), overrides, timeout_s=120)
    for rank, res in enumerate(results):
        assert res["error"] == "DistributedError", (rank, res)
        msg = res["message"]
        assert msg.startswith("ranks disagree on "), msg
        named = msg.removeprefix("ranks disagree on ").split(" (ranks")[0].split(", ")
        assert named == keys, msg  # exactly the differing keys, nothing derived from them
        assert "(ranks [1] differ from rank 0)" in msg
    assert results[0]["message"] == results[1]["message"]
    # nothing was trained or written: no checkpoint, history or config in the output folder
    assert not (out / "ckpt").exists() and not (out / "config.yaml").exists() and not (out / "history.jsonl").exists()


@pytest.mark.slow
def test_ranks_that_agree_train(tmp_path: Path):
    out = tmp_path / "run"
    results = launch(_rank_with_its_own_overrides, 2, str(out), [["data.batch_size=64"], ["data.batch_size=64"]],
                     timeout_s=180)
    assert [r["error"] for r in results] == ["", ""], results
    # 1437 images / 2 ranks = 718 each, 11 full batches of 64; the worklogs did not make the folder look taken
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["mnist_cnn-1_11.pt", "mnist_cnn-best.pt"]
    assert sorted(p.name for p in (out / "log").iterdir()) == ["worklog.0", "worklog.1"]
