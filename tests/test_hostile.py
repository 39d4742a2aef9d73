"""Every file the tool reads is untrusted data (docs/THREAT_MODEL.md): crafted inputs each get one line and
exit 2, fast, and touch nothing outside the run. Each case here failed before its fix (a deleted file,
a write outside the output folder, a hang, a traceback)."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from PIL import Image

from bounded import within
from torchboost.cli import main
from torchboost.data.mnist import read_idx
from torchboost.errors import CheckpointError, DataError
from torchboost.migrate.pdparams import parse_pdparams

FAST = ["--config", "digits-lenet", "--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def one_line_error(capsys, argv: list[str]) -> str:
    with within(120, argv):  # a generous bound against hangs, not a speed claim
        code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.slow
def test_a_crafted_checkpoint_cannot_delete_files_outside_its_run(tmp_path, capsys):
    victim = tmp_path / "important.txt"
    victim.write_text("keep me")
    neighbour = tmp_path / "other-run" / "ckpt" / "mnist_cnn-1_23.pt"
    neighbour.parent.mkdir(parents=True)
    neighbour.write_bytes(b"someone else's checkpoint")
    out = tmp_path / "run"
    assert main(["train", *FAST, "--epochs", "1", "-o", str(out)]) == 0
    (ckpt,) = (out / "ckpt").glob("mnist_cnn-1_*.pt")
    state = torch.load(ckpt, weights_only=True)
    state["callbacks"]["ModelCheckpoint"]["files"] = [str(victim), "../../other-run/ckpt/mnist_cnn-1_23.pt",
                                                      "../../important.txt", ckpt.name]
    torch.save(state, ckpt)
    capsys.readouterr()
    assert main(["train", *FAST, "--epochs", "4", "--set", "checkpoint.keep_max=1", "-o", str(out),
                 "--force", "--resume", str(ckpt)]) == 0
    assert victim.read_text() == "keep me"
    assert neighbour.read_bytes() == b"someone else's checkpoint"
    assert [p.name.rsplit("_", 1)[0] for p in (out / "ckpt").glob("mnist_cnn-*_*.pt")] == ["mnist_cnn-4"]


@pytest.mark.parametrize("prefix", ["../../P/ckpt/mnist_cnn", "/tmp/abs", "a/b", "..", "", "x" * 245, "a\\b"])
def test_checkpoint_prefix_is_a_file_name(prefix, tmp_path, capsys):
    err = one_line_error(capsys, ["train", *FAST, "--set", f"checkpoint.prefix={prefix}", "-o", str(tmp_path / "r")])
    assert "checkpoint.prefix" in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "P").exists()


def test_ckpt_being_a_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "ckpt").write_text("a file where the checkpoint folder goes")
    err = one_line_error(capsys, ["train", *FAST, "--epochs", "1", "-o", str(out)])
    assert "ckpt" in err


def _yaml_alias_bomb(key_path: str) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    section, _, key = key_path.rpartition(".")
    lines.append(f"{section}: {{{key}: *a9}}" if section else f"{key}: *a9")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,match", [
    (_yaml_alias_bomb("train.metrics"), "aliases"),
    (_yaml_alias_bomb("optim.weight_decay_groups"), "aliases"),
    (_yaml_alias_bomb("name"), "aliases"),
    (_yaml_alias_bomb("output"), "aliases"),
    ("train: " + "[" * 20000 + "]" * 20000 + "\n", "nested more than"),
    ("train: {epochs: 2}\ntrain: {seed: 1}\n", "appears twice"),
    ("train:\n  epochs: 2\n  epochs: 3\n", "appears twice"),
])
def test_hostile_recipes_are_refused_fast(text, match, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert match in one_line_error(capsys, ["train", "--config", str(recipe)])


def test_pdparams_memo_bomb_is_refused_fast(tmp_path):
    """236 bytes whose memo references one list 10 ways 11 levels deep: 10^11 copies if copied per reference."""
    # EMPTY_LIST PUT 1 POP, then list i = [list i-1] * 10 via GET, PUT i (POP all but the last)
    lists = b"]q\x010" + b"0".join(b"(" + (b"h" + bytes([i - 1])) * 10 + b"lq" + bytes([i]) for i in range(2, 13))
    ops = b"\x80\x02}q\x00(X\x01\x00\x00\x00w" + lists + b"u."
    with within(60, "the memo bomb"), pytest.raises(CheckpointError, match="not a named array"):
        parse_pdparams(ops, "bomb.pdparams")


def test_checkpoint_config_with_a_shared_reference_bomb_is_refused(tmp_path, capsys):
    shared: list = ["x"] * 10
    for _ in range(8):
        shared = [shared] * 10  # 10^9 paths through 80 lists
    path = tmp_path / "bomb.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "config": {"train": {"metrics": shared}}}, path)
    assert path.stat().st_size < 1 << 20
    for argv in (["eval", "--checkpoint", str(path)], ["diff-config", str(path), "mnist-lenet"]):
        err = one_line_error(capsys, argv)
        assert "more than" in err or "not" in err


def test_gzip_that_inflates_past_what_its_header_declares(tmp_path):
    header = bytes([0, 0, 8, 3]) + struct.pack(">III", 10, 28, 28)
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(gzip.compress(header + bytes(7840) + bytes(200_000_000), 9))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DataError, match="inflates past 7,856 bytes"):
        read_idx(bomb)


def test_image_claiming_too_many_pixels_is_refused_before_decoding(tmp_path, capsys):
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            Image.new("L", (8, 8)).save(tmp_path / split / c / "ok.png")
    Image.new("1", (12000, 12000)).save(tmp_path / "train" / "a" / "huge.png")  # 144 M pixels, a 20 kB file
    err = one_line_error(capsys, ["train", "--data", str(tmp_path), "--set", "model.name=mnist_cnn",
                                  "--set", "data.image_size=8", "--epochs", "1", "-o", str(tmp_path / "out")])
    assert "huge.png" in err and "pixel" in err


def test_safe_unpickle_never_imports(tmp_path):
    class Boom:
        def __reduce__(self):
            return (Path.write_text, (tmp_path / "pwned", "x"))

    with pytest.raises(CheckpointError):
        parse_pdparams(pickle.dumps({"w": Boom()}, protocol=4), "evil.pdparams")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_overwrite_deletes_only_what_a_run_wrote(tmp_path, capsys):
    """A folder of the user's files is not a run; --overwrite of a real run removes exactly the files its
    manifest lists (and still match), never a user's file in the same folders."""
    out = tmp_path / "r"
    user = {"profile/mycode.py": b"print('mine')", "tensorboard/README": b"notes", "ckpt/resnet50-best.pt": b"w",
            "notes.txt": b"mine"}
    for rel, data in user.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    assert main(["train", *FAST, "--epochs", "1", "-o", str(out)]) == 0  # user files only: not "another run"
    assert main(["train", *FAST, "--epochs", "1", "-o", str(out)]) == 2  # now it holds a run
    run_files = json.loads((out / ".torchboost-run.json").read_text())["files"]
    assert not set(user) & set(run_files) and "config.yaml" in run_files
    (out / "history.csv").write_text("edited by the user")  # no longer the run's: neither deleted nor overwritten
    capsys.readouterr()
    assert "history.csv was changed since the run wrote it" in one_line_error(
        capsys, ["train", *FAST, "--epochs", "1", "-o", str(out), "--overwrite"])
    assert (out / "history.csv").read_text() == "edited by the user" and (out / "config.yaml").is_file()
    (out / "history.csv").unlink()
    assert main(["train", *FAST, "--epochs", "1", "-o", str(out), "--overwrite"]) == 0
    assert {rel: (out / rel).read_bytes() for rel in user} == user
    assert len(list((out / "ckpt").glob("mnist_cnn-*_*.pt"))) == 1


@pytest.mark.slow
def test_ownership_soak_changes_no_file_that_is_not_a_runs(tmp_path):
    """benchmarks/soak_ownership.py, short: new runs, overwrites, resumes (from the folder, from a poisoned
    checkpoint, into another folder) across three run folders holding user files: 0 user files changed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak_ownership", Path(__file__).parents[1] / "benchmarks" /
                                                  "soak_ownership.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    result = soak.soak(tmp_path, rounds=14, seed=1)
    assert result["changed"] == [] and len(result["operations"]) >= 4, result
