"""Generated hostile *kinds* of input (Hypothesis), beside test_hostile_generated's values: the shape of the file
system (links at every level, in and out of the run, dangling, looping; FIFOs where files are read) and every
field of saved state (a checkpoint's counters, RNG, classes, config, callbacks' progress), for the subcommands
that read them. Every example runs the real entry point under an alarm and asserts: nothing outside the run
changed, no command ran (a canary), no hang, no traceback (an exception escaping `main` fails the example),
and a refusal is one `error:` line. CI runs the fixed-seed profile; `--hypothesis-profile=soak` runs the long
hunt and `--hypothesis-show-statistics` prints how many examples ended in each outcome."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st
from PIL import Image

from examples import cli_generator
from test_trust import FAST, checkpoint_of, cli, tree_digest

pytestmark = pytest.mark.usefixtures("one_thread")

# Where a run reads and writes, and what may be found there instead of what the tool put there.
RUN_PATHS = ["ckpt", "ckpt/mnist_cnn-1_5.pt", "ckpt/mnist_cnn-best.pt", "tensorboard", "log", "log/worklog.0",
             "profile", "config.yaml", "history.jsonl", "history.csv", ".lock", ".torchboost-run.json"]
KINDS = ["absent", "dir", "file", "link-out-dir", "link-out-file", "link-in", "dangling", "loop", "fifo"]
COMMANDS = ["fresh", "overwrite", "resume-auto", "resume-folder", "eval", "predict", "diff-config"]


def make(path: Path, kind: str, outside: Path) -> None:
    """Put `kind` at `path` (replacing what is there)."""
    if path.parent.is_symlink() or (path.parent.exists() and not path.parent.is_dir()):
        return  # nothing can be put below a file or a link: that shape is the parent's
    if path.is_symlink() or path.is_file() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if path.parent.is_symlink() or (path.parent.exists() and not path.parent.is_dir()):
        return  # nothing can be put below a file or a link: that shape is the parent's
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_bytes(b"\x80\x02garbage")
    elif kind == "link-out-dir":
        path.symlink_to(outside / "d")
    elif kind == "link-out-file":
        path.symlink_to(outside / "f.pt")
    elif kind == "link-in":
        path.symlink_to(".")
    elif kind == "dangling":
        path.symlink_to(outside / "nothing-here")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "fifo":
        os.mkfifo(path)


def assert_sound(code: int, err: str, outside: Path, before: dict) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = [l for l in err.splitlines() if l.strip() and not l.startswith(("note:", "warning:"))]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        what = lines[0].removeprefix("error: ").split(" — ")[0]
        event("refused: " + " ".join("PATH" if "/" in w else w for w in what.split())[:70])
    else:
        event("accepted")
    assert tree_digest(outside) == before, "a file outside the run changed"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished 1-epoch run to copy into each example."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert cli("train", *FAST, "--epochs", 1, "-o", out)[0] == 0
    return out


def command(name: str, run: Path, base: Path) -> list:
    ckpt = run / "ckpt" / checkpoint_of(base).name
    return {"fresh": ["train", *FAST, "--epochs", 1, "-o", run],
            "overwrite": ["train", *FAST, "--epochs", 1, "-o", run, "--overwrite"],
            "resume-auto": ["train", *FAST, "--epochs", 2, "-o", run, "--force", "--resume", "auto"],
            "resume-folder": ["train", *FAST, "--epochs", 2, "--force", "--resume", run],
            "eval": ["eval", "--checkpoint", ckpt],
            "predict": ["predict", "--checkpoint", ckpt, base / "history.png"],
            "diff-config": ["diff-config", run, "digits-lenet"]}[name]


@cli_generator
@given(tree=st.dictionaries(st.sampled_from(RUN_PATHS), st.sampled_from(KINDS), min_size=1, max_size=4),
       name=st.sampled_from(COMMANDS), copy=st.booleans())
@pytest.mark.slow
def test_any_run_folder_shape(tree, name, copy, base, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tree")
    outside = tmp / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "d" / "mnist_cnn-1_5.pt").write_bytes(b"another run's checkpoint")
    shutil.copy(checkpoint_of(base), outside / "f.pt")
    run = tmp / "run"
    if copy:  # a finished run's folder, then reshaped; else a new folder holding only the generated shapes
        shutil.copytree(base, run)
    run.mkdir(exist_ok=True)
    for rel, kind in sorted(tree.items(), key=lambda kv: kv[0].count("/")):
        make(run / rel, kind, outside)
    before = tree_digest(outside)
    existed = tree_digest(run)
    code, _, err = cli(*command(name, run, base), seconds=60)
    assert_sound(code, err, outside, before)
    if code == 0 and name in ("fresh", "overwrite", "resume-auto", "resume-folder"):  # what it wrote is inside
        now, real = tree_digest(run), Path(os.path.realpath(run))

        def key(p: Path) -> str:  # a checkpoint reached through a link inside the run: by its real place
            return str(Path(os.path.realpath(p)).relative_to(real)) if Path(os.path.realpath(p)).is_relative_to(real) \
                else str(p)
        written = [p for p in (run / "ckpt").glob("mnist_cnn-*_*.pt") if now.get(key(p)) != existed.get(key(p))]
        assert written and all(Path(os.path.realpath(p)).is_relative_to(os.path.realpath(run)) for p in written)


IMAGE_KINDS = ["image", "fifo", "dangling", "link-out-image", "link-out-folder", "loop", "empty", "folder-link-up"]


def make_entry(path: Path, kind: str, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "image":
        Image.new("L", (8, 8), 99).save(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(outside / "missing.png")
    elif kind == "link-out-image":
        path.symlink_to(outside / "img.png")
    elif kind == "link-out-folder":
        path.with_suffix("").symlink_to(outside / "imgs", target_is_directory=True)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder-link-up":
        path.with_suffix("").symlink_to("..", target_is_directory=True)


@cli_generator
@given(entries=st.dictionaries(st.tuples(st.sampled_from(["train", "val"]), st.sampled_from(["a", "b"]),
                                         st.sampled_from(["x.png", "y.png", "deep/z.png"])),
                               st.sampled_from(IMAGE_KINDS), max_size=4),
       name=st.sampled_from(["train", "export-shards", "predict"]), skip=st.booleans())
@pytest.mark.slow
def test_any_image_folder_shape(entries, name, skip, base, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("images")
    outside = tmp / "outside"
    (outside / "imgs").mkdir(parents=True)
    Image.new("L", (8, 8), 7).save(outside / "img.png")
    Image.new("L", (8, 8), 9).save(outside / "imgs" / "o.png")
    data = tmp / "data"
    for split in ("train", "val"):
        for c in ("a", "b"):
            for i in range(2):
                make_entry(data / split / c / f"ok{i}.png", "image", outside)
    for (split, c, rel), kind in entries.items():
        make_entry(data / split / c / rel, kind, outside)
    before = tree_digest(outside)
    small = ["--set", "model.name=mnist_cnn", "--set", "data.image_size=8", "--set", "train.progress_bar=false",
             "--set", f"data.skip_corrupt={str(skip).lower()}"]
    argv = {"train": ["train", "--data", data, *small, "--epochs", 1, "-b", 2, "-o", tmp / "out"],
            "export-shards": ["export-shards", data, tmp / "shards"],
            "predict": ["predict", "--checkpoint", checkpoint_of(base), data / "train"]}[name]
    code, _, err = cli(*argv, seconds=60)
    assert_sound(code, err, outside, before)


# Every field of a training checkpoint, and values of every type for it.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.sampled_from([0, -1, 2**31, 2**63, 10**12]), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8), st.sampled_from(["pipe:touch CANARY", "{pipe:touch CANARY,a.tar}", "\n\x1b[2K",
                                                          "../../x", "/etc/passwd"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(st.text(max_size=5), SCALARS, max_size=3),
                   st.sampled_from([torch.zeros(3), torch.full((2,), float("nan")), torch.zeros(624, dtype=torch.int64),
                                    torch.zeros(0, dtype=torch.uint8)]))


def leaf_paths(obj, prefix=()) -> list[tuple]:
    """Paths to every leaf of the checkpoint's plain structure (dicts and lists; tensors are leaves)."""
    if isinstance(obj, dict) and obj and prefix[:1] != ("model",):
        return [p for k, v in obj.items() for p in leaf_paths(v, (*prefix, k))]
    if isinstance(obj, (list, tuple)) and obj and len(obj) < 20:
        return [p for i, v in enumerate(obj) for p in leaf_paths(v, (*prefix, i))]
    return [prefix]


def replaced(obj, path: tuple, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: replaced(obj[head], rest, value)}
    items = list(obj)
    items[head] = replaced(items[head], rest, value)
    return type(obj)(items) if isinstance(obj, tuple) else items


@pytest.fixture(scope="module")
def mid_epoch(tmp_path_factory) -> tuple[Path, dict]:
    """A run stopped mid-epoch (a checkpoint every 2 updates, 2 epochs asked, killed at none: the last
    numbered checkpoint of epoch 1 is mid-epoch) and its checkpoint's contents."""
    out = tmp_path_factory.mktemp("mid") / "run"
    assert cli("train", *FAST, "--epochs", 1, "--set", "checkpoint.save_every_steps=2", "-o", out)[0] == 0
    ckpt = min((out / "ckpt").glob("mnist_cnn-1_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return ckpt, torch.load(ckpt, weights_only=True)


@cli_generator
@given(data=st.data(), value=VALUES, name=st.sampled_from(["resume", "eval", "predict", "diff-config"]))
@pytest.mark.slow
def test_any_value_in_any_field_of_a_checkpoint(data, value, name, mid_epoch, tmp_path_factory, monkeypatch):
    source, state = mid_epoch
    path = data.draw(st.sampled_from(leaf_paths(state)), label="field")
    tmp = tmp_path_factory.mktemp("state")
    monkeypatch.chdir(tmp)  # a `pipe:touch CANARY` that ran would leave tmp/CANARY
    ckpt = tmp / "run" / "ckpt" / source.name
    ckpt.parent.mkdir(parents=True)
    try:
        torch.save(replaced(state, path, value), ckpt)
    except Exception:  # noqa: BLE001 - a value torch cannot save cannot be in a file either
        return
    argv = {"resume": ["train", *FAST, "--epochs", 2, "--force", "--resume", ckpt],
            "eval": ["eval", "--checkpoint", ckpt],
            "predict": ["predict", "--checkpoint", ckpt, source.parent.parent / "history.png"],
            "diff-config": ["diff-config", ckpt, "digits-lenet"]}[name]
    code, out, err = cli(*argv, seconds=90)
    assert_sound(code, err, tmp / "nothing-outside", {})
    assert not (tmp / "CANARY").exists(), "a command from the checkpoint ran"
    if name == "predict" and code == 0:  # one line per image, whatever the class names say
        assert out.count("\n") == 1, out
