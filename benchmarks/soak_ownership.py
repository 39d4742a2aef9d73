"""Soak: a run touches only its own files. Three run folders and a folder of the user's files (some inside
the run folders' ckpt/, tensorboard/ and profile/), then N rounds of random operations on the runs — resume,
--overwrite, new runs that prune, resumes from checkpoints edited to name other files — and a byte
comparison of every file that is not a run's own, before and after.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/soak_ownership.py --rounds 30 --seed 0

Prints the operations tried, the exit codes seen and `changed user files: 0` when nothing else was touched.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import random
import tempfile
from pathlib import Path

import torch

from torchboost.cli import main

QUIET = ["-c", "digits-lenet", "--set", "train.progress_bar=false", "--set", "train.log_every=1000",
         "--set", "checkpoint.save_every_epochs=1", "--set", "checkpoint.keep_max=2"]
USER_FILES = ["profile/mycode.py", "tensorboard/README", "ckpt/resnet50-best.pt", "ckpt/notes.txt", "notes.md"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def user_files(root: Path) -> dict[str, str]:
    """Every file that is not written by a run: in the user folder, and the user's files in run folders."""
    found = {str(p.relative_to(root)): digest(p) for p in (root / "user").rglob("*") if p.is_file()}
    for run in ("r0", "r1", "r2"):
        found.update({f"{run}/{rel}": digest(root / run / rel) for rel in USER_FILES if (root / run / rel).is_file()})
    return found


def cli(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def poison(ckpt: Path, root: Path) -> None:
    """A shared checkpoint edited to name files outside its run (the list ModelCheckpoint prunes)."""
    state = torch.load(ckpt, weights_only=True)
    state["callbacks"]["ModelCheckpoint"]["files"] = [str(root / "user" / "a.txt"), "../../user/b.bin",
                                                      "../../r1/ckpt/notes.txt", ckpt.name]
    torch.save(state, ckpt)


def soak(root: Path, rounds: int, seed: int) -> dict:
    rng = random.Random(seed)
    (root / "user").mkdir(parents=True)
    (root / "user" / "a.txt").write_text("mine")
    (root / "user" / "b.bin").write_bytes(bytes(range(256)))
    for run in ("r0", "r1", "r2"):
        for rel in USER_FILES:
            (root / run / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / run / rel).write_text(f"user file {run}/{rel}")
    before = user_files(root)
    codes: dict[str, list[int]] = {}
    for _ in range(rounds):
        run = root / rng.choice(["r0", "r1", "r2"])
        op = rng.choice(["new", "overwrite", "resume", "resume-poisoned", "resume-elsewhere"])
        ckpts = sorted((run / "ckpt").glob("mnist_cnn-*_*.pt"))
        if op == "new":
            argv = ["train", *QUIET, "--epochs", "1", "-o", str(run)]
        elif op == "overwrite":
            argv = ["train", *QUIET, "--epochs", str(rng.randint(1, 2)), "-o", str(run), "--overwrite"]
        elif not ckpts:
            continue
        elif op == "resume-poisoned":
            poison(ckpts[-1], root)
            argv = ["train", *QUIET, "--epochs", "20", "--resume", str(ckpts[-1])]
        elif op == "resume-elsewhere":
            argv = ["train", *QUIET, "--epochs", "20", "--resume", str(ckpts[-1]), "-o", str(root / "user")]
        else:
            argv = ["train", *QUIET, "--epochs", "20", "--resume", str(run), "--set", "train.epochs=" +
                    str(int(ckpts[-1].name.split("-")[1].split("_")[0]) + 1)]
        codes.setdefault(op, []).append(cli(argv))
    after = user_files(root)
    changed = sorted(k for k in before if after.get(k) != before[k])
    return {"operations": {k: len(v) for k, v in codes.items()},
            "exit codes": {k: sorted(set(v)) for k, v in codes.items()}, "changed": changed}


def main_() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = soak(Path(tmp), args.rounds, args.seed)
    print(f"operations: {result['operations']}")
    print(f"exit codes: {result['exit codes']}")
    print(f"changed user files: {len(result['changed'])} {result['changed']}")


if __name__ == "__main__":
    main_()
