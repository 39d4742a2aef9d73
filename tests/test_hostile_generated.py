"""Generated bad input, not hand-listed (Hypothesis): values drawn by type for every config key and every flag
of every subcommand, through the real CLI entry point. A run fails on a traceback (any exception escaping
`main`), on a hang, and on exit 0 whose resolved config differs from what was asked.

The schema and the argparse parser are introspected, so a new key or flag is covered without editing this
file. Work that would start after every check passed (the training loop, a race's epochs, a benchmark's
timed steps) is replaced by a sentinel: reaching it means "accepted", and the setup before it (model,
optimizer, output folder, data) ran for real. CI runs a fixed seed and example count; the soak profile
(`pytest --hypothesis-profile=soak tests/test_hostile_generated.py`) runs many more.
"""

from __future__ import annotations

import shutil
import argparse
import contextlib
import io
import math
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from bounded import within
from examples import cli_generator
from torchboost.cli import build_parser, main
from torchboost.options import leaf_fields
from torchboost.recipe.config import Config

KEYS = [key for key, *_ in leaf_fields(Config())]
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**32, 2**63, 10**20]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e300, -1e-300, 1e20, 0.5]),
    st.text(max_size=12), st.sampled_from(["", " ", "ü", "{foo}", "../..", "/abs", "a/b", "meta", "nan", "O9"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)


class Started(BaseException):
    """Raised where the real work would begin: everything before it accepted the input."""


@pytest.fixture(scope="module", autouse=True)
def bounded_memory():
    """A generated input that allocates without bound must fail here (MemoryError), not take the machine."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_AS, old)


@pytest.fixture(autouse=True)
def stop_before_work(monkeypatch, tmp_path):
    def started(*args, **kwargs):
        raise Started()

    monkeypatch.setattr("torchboost.train.model.Model.train", started)
    monkeypatch.setattr("torchboost.race.lanes.Lane.train_epoch", started)
    monkeypatch.setattr("torchboost.bench.time_steps", started)
    monkeypatch.setattr("torchboost.bench.data_rate", started)
    monkeypatch.setattr("torchboost.data.export.find_samples", started)  # export-shards, once its input is checked
    monkeypatch.setattr("torchboost.distributed.agent.run_agent", started)  # launch, once every process's run is checked
    monkeypatch.setattr("torchboost.recipe.lr_find.find_lr", started)  # lr-find / race --lr-find, once built
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)


def run(argv: list[str], seconds: int = 60) -> tuple[int | str, str, str]:
    """(exit code or "started", stdout, stderr) of the real entry point; a hang or a traceback fails (a hang
    raises `bounded.Hang`, which main's `except OSError` cannot turn into a one-line exit 2 as a TimeoutError)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with within(seconds, argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code: int | str = main(argv)
    except Started:
        code = "started"
    except SystemExit as e:  # argparse exits are codes, not tracebacks
        code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_refused_in_one_line(code, err: str, argv) -> None:
    assert code == 2, (argv, code, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err[-500:])


def _same(asked, got) -> bool:
    if isinstance(asked, str) and isinstance(got, float):  # a float field reads "1e-4" (YAML 1.1 leaves it text)
        try:
            return _same(float(asked), got)
        except ValueError:
            return False
    if isinstance(asked, float) and isinstance(got, float):
        return asked == got or (math.isnan(asked) and math.isnan(got))
    if isinstance(asked, bool) or isinstance(got, bool):
        return asked is got
    if isinstance(asked, int) and isinstance(got, float):
        return float(asked) == got
    if isinstance(asked, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(asked) == len(got) and all(_same(a, g) for a, g in zip(asked, got))
    if isinstance(asked, dict) and isinstance(got, dict):  # free-form sections merge into their defaults
        return all(k in got and _same(v, got[k]) for k, v in asked.items())
    return asked == got


@given(key=st.sampled_from(KEYS), value=VALUES)
@pytest.mark.slow
def test_any_value_for_any_config_key(key, value):
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    argv = ["train", "--print-config", "--set", f"{key}={text}"]
    code, out, err = run(argv)
    event(f"config value: {'refused, one line' if code == 2 else 'accepted' if code == 0 else code}")
    if code == 2:
        return assert_refused_in_one_line(code, err, argv)
    assert code == 0, (argv, code, err[-500:])
    printed = yaml.safe_load(out)
    got = printed
    for part in key.split("."):
        got = got[part]
    asked = yaml.safe_load(text)
    assert _same(asked, got), f"{key}: asked {asked!r}, the resolved config says {got!r}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(complete=True)  # every subcommand's flags, those read from registries too
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flags(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in sub._actions if a.option_strings and not isinstance(a, (argparse._HelpAction,
                                                                               argparse._VersionAction))]


FLAGS = [(name, flag.option_strings[-1]) for name, sub in _subcommands().items() for flag in _flags(sub)]
FLAG_TEXT = st.one_of(st.text(max_size=10), st.integers(min_value=-(2**66), max_value=2**66).map(str),
                      st.floats().map(repr), st.sampled_from(["0", "-1", "nan", "inf", "", "1e20", "x=1", "sgd=nan",
                                                              "../..", "/", "{foo}", "999999999999"]))


@pytest.fixture(scope="module")
def inputs(digits_run, tmp_path_factory) -> dict[str, str]:
    """A real checkpoint, an image and a folder for the subcommands that read files."""
    root = tmp_path_factory.mktemp("inputs")
    shutil.copytree(digits_run, root / "run")
    (ckpt,) = (root / "run" / "ckpt").glob("mnist_cnn-1_*.pt")
    from PIL import Image

    (root / "img").mkdir()
    Image.new("L", (8, 8), 128).save(root / "img" / "a.png")
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / "folder" / split / c).mkdir(parents=True)
            Image.new("L", (8, 8), 100).save(root / "folder" / split / c / "0.png")
    return {"ckpt": str(ckpt), "img": str(root / "img" / "a.png"), "root": str(root), "folder": str(root / "folder")}


def base_argv(name: str, inputs: dict[str, str], out: Path) -> list[str]:
    """The smallest valid call of each subcommand (the drawn flag is appended and wins)."""
    return {
        "train": ["train", "--config", "digits-lenet", "-o", str(out / "t")],
        "eval": ["eval", "--checkpoint", inputs["ckpt"]],
        "predict": ["predict", "--checkpoint", inputs["ckpt"], inputs["img"]],
        "recipes": ["recipes"],
        "export-folder": ["export-folder", "--dataset", "digits", "--out", str(out / "f")],
        "export-shards": ["export-shards", inputs["folder"], str(out / "s")],
        "export": ["export", inputs["ckpt"], str(out / "m.ts")],  # TorchScript: the quickest format to write
        "options": ["options"],
        "launch": ["launch", "train", "--config", "digits-lenet", "-o", str(out / "l")],
        "convert": ["convert", inputs["ckpt"], str(out / "w.safetensors"), "--arch", "none"],
        "align": ["align", "-c", "digits-lenet", "--reference-config", "digits-lenet"],
        "diff-config": ["diff-config", inputs["ckpt"], "digits-lenet"],
        "debug-layers": ["debug-layers", "-c", "digits-lenet"],
        "race": ["race", "-c", "digits-lenet", "--optimizers", "sgd", "--seeds", "1", "--epochs", "1",
                 "-o", str(out / "r")],
        "lr-find": ["lr-find", "-c", "digits-lenet", "--updates", "20", "-o", str(out / "lf")],
        "bench": ["bench", "--model", "mnist_cnn", "--image-size", "8", "--batch-size", "2", "--steps", "1",
                  "--mode", "train"],
    }[name]


@cli_generator
@given(flag=st.sampled_from(FLAGS), value=FLAG_TEXT, data=st.data())
@pytest.mark.slow
def test_any_value_for_any_flag_of_any_subcommand(flag, value, data, inputs, tmp_path_factory):
    name, option = flag
    out = tmp_path_factory.mktemp("out")
    argv = base_argv(name, inputs, out)
    action = next(a for a in _flags(_subcommands()[name]) if option in a.option_strings)
    drawn = [option] if action.nargs == 0 else [option, value]
    # launch's own flags go before `train ...`, which takes the rest of the line
    argv = [argv[0], *drawn, *argv[1:]] if name == "launch" else argv + drawn
    code, _, err = run(argv)
    event(f"flag value: {'refused, one line' if code == 2 else 'accepted' if code in (0, 'started') else code}")
    if code in (0, "started"):
        return
    assert code == 2 and "Traceback" not in err, (argv, code, err[-800:])
    assert err.strip().splitlines()[-1].startswith("error: ") or "usage:" in err, (argv, err[-500:])
