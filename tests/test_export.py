"""`torchboost export` (ONNX, TorchScript, ExportedProgram) and `predict` on the exported .onnx, on one
digits-lenet run: formats, metadata, refusals, links. Every zoo network's exports in every format, checked
against torch's logits, are tests/test_zoo_generator.py's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from test_cli import run  # noqa: F401  (fixture: one digits-lenet epoch shared with test_cli's commands)
from test_trust import cli, refused, tree_digest
from torchboost.data.builtin import load_builtin
from torchboost.deploy import DeployInfo, OnnxClassifier, format_for
from torchboost.deploy.metadata import META_FILE
from torchboost.errors import CheckpointError, ConfigError

pytestmark = [pytest.mark.usefixtures("one_thread"),  # torch 2.13 deprecates TorchScript; it is still exported
              pytest.mark.filterwarnings("ignore:`torch.jit.(load|save)` is deprecated:DeprecationWarning")]


def test_format_comes_from_the_name_and_must_agree_with_format():
    assert [format_for(p) for p in ("a.onnx", "a.ONNX", "a.pt2", "a.torchscript.pt", "a.ts")] == \
        ["onnx", "onnx", "exported-program", "torchscript", "torchscript"]
    assert format_for("model.bin", "onnx") == "onnx"
    for name, fmt, words in (("a.pt", None, "cannot tell"), ("a", None, "cannot tell"), ("a.onnx", "tflite", "unknown"),
                             ("a.pt2", "onnx", "says exported-program but --format is onnx")):
        with pytest.raises(ConfigError, match=words):
            format_for(name, fmt)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("imgs")
    ds = load_builtin("digits", "test")
    paths = [folder / f"{i}.png" for i in range(6)]
    for i, p in enumerate(paths):
        Image.fromarray(ds.images[i, 0].numpy()).save(p)
    return [str(p) for p in paths]


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:  # noqa: F811
    """The run's best checkpoint in the three formats, by one `export` (one reading, one trace for two of them)."""
    out = tmp_path_factory.mktemp("exp")
    names = {"m.onnx": "onnx", "m.pt2": "exported-program", "m.torchscript.pt": "torchscript"}
    code, stdout, err = cli("export", run / "ckpt" / "mnist_cnn-best.pt", *(out / name for name in names),
                            seconds=120)
    assert code == 0 and not err, err
    assert stdout.splitlines() == [f"wrote {out / name} ({fmt}): mnist_cnn on float32 N×1×8×8, normalised: resize 8, "
                                   "centre crop 8, mean (0.3056) std (0.3764); 10 classes"
                                   for name, fmt in names.items()], stdout
    return out


def predictions(*argv) -> list[dict]:
    code, out, err = cli("predict", "--format", "json", *argv)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_predict_with_the_exported_onnx_agrees_with_the_checkpoint(run, exported, images):  # noqa: F811
    ckpt = predictions("--checkpoint", run / "ckpt" / "mnist_cnn-best.pt", "--topk", "10", *images)
    onnx = predictions("--checkpoint", exported / "m.onnx", "--topk", "10", *images)
    assert [r["file"] for r in onnx] == images
    for a, b in zip(ckpt, onnx):
        assert a["top"][0]["class"] == b["top"][0]["class"]
        pa, pb = ({t["class"]: t["probability"] for t in r["top"]} for r in (a, b))
        assert pa.keys() == pb.keys() and max(abs(pa[k] - pb[k]) for k in pa) <= 1e-4
    code, text, _ = cli("predict", "--checkpoint", exported / "m.onnx", "--topk", "2", images[0])
    assert code == 0 and text.startswith(f"{images[0]}: ") and text.count(",") == 1  # the same text format


@pytest.mark.slow
def test_a_run_that_normalised_on_the_device_predicts_and_exports_the_same(run, exported, images,  # noqa: F811
                                                                           tmp_path):
    """predict/eval read such a run's images as uint8 (its eval transform): the Model normalises them with the
    run's statistics (they failed: 'a uint8 batch needs input_norm'); the export takes normalised floats."""
    ckpt = run / "ckpt" / "mnist_cnn-best.pt"
    on_device = ["--set", "data.normalize_on_device=true"]
    assert predictions("--checkpoint", ckpt, *on_device, *images) == predictions("--checkpoint", ckpt, *images)
    code, out, err = cli("eval", "--checkpoint", ckpt, *on_device)
    assert code == 0 and "top_1_accuracy=" in out, err
    code, _, err = cli("export", ckpt, tmp_path / "m.onnx", *on_device, seconds=120)
    assert code == 0, err
    assert OnnxClassifier(tmp_path / "m.onnx").info == OnnxClassifier(exported / "m.onnx").info


@pytest.mark.parametrize("size, crop_pct", [(224, 0.875), (48, 0.81)])  # 48 / (48 / 59) = 58.99...: resize 59 kept
def test_the_metadata_rebuilds_the_runs_evaluation_transform_exactly(size, crop_pct):
    from torchboost.recipe.data import eval_preprocess
    from torchboost.recipe.export import deploy_info
    from torchboost.recipe.load import load_config

    cfg = load_config("resnet50-imagenet-sgd", ["model.num_classes=3", "data.path=unused",
                                                f"data.image_size={size}", f"data.crop_pct={crop_pct}"])
    info = deploy_info(cfg, ["a", "b", "c"])
    run_transform = eval_preprocess(cfg.data)
    assert (info.size, info.resize, info.mean, info.std) == (size, run_transform.resize, (0.485, 0.456, 0.406),
                                                             (0.229, 0.224, 0.225))
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 410, 3), dtype=np.uint8))
    rebuilt = DeployInfo.from_props(info.to_props(), "props").transform()
    assert torch.equal(rebuilt(img), run_transform(img))


def test_the_torch_archives_record_what_the_onnx_records(exported):
    info = OnnxClassifier(exported / "m.onnx").info
    assert (info.model, info.input_size, len(info.classes)) == ("mnist_cnn", (1, 8, 8), 10)
    for path, load in ((exported / "m.torchscript.pt", lambda p, e: torch.jit.load(str(p), _extra_files=e)),
                       (exported / "m.pt2", lambda p, e: torch.export.load(p, extra_files=e))):
        extra = {META_FILE: ""}
        load(path, extra)
        assert DeployInfo.from_props(json.loads(extra[META_FILE]), str(path)) == info


def test_bad_checkpoints_onnx_files_and_outputs_are_one_line(run, exported, images, tmp_path):  # noqa: F811
    ckpt = run / "ckpt" / "mnist_cnn-best.pt"
    os.mkfifo(tmp_path / "fifo.pt")
    os.mkfifo(tmp_path / "fifo.onnx")
    (tmp_path / "dir.onnx").mkdir()
    (tmp_path / "trunc.onnx").write_bytes((exported / "m.onnx").read_bytes()[:5000])
    (tmp_path / "noise.onnx").write_bytes(b"\x08\x07not onnx" * 50)
    assert "not found" in refused("export", tmp_path / "missing.pt", tmp_path / "m.onnx")
    assert "not a file" in refused("export", tmp_path / "fifo.pt", tmp_path / "m.onnx")  # never opened: no hang
    assert "not a file" in refused("export", tmp_path / "dir.onnx", tmp_path / "m.onnx")
    assert "exported ONNX model, not a checkpoint" in refused("export", exported / "m.onnx", tmp_path / "m.pt2")
    assert "cannot tell the export format" in refused("export", ckpt, tmp_path / "m.pt")
    assert "--format is onnx" in refused("export", ckpt, tmp_path / "m.pt2", "--format", "onnx")
    assert "is a folder" in refused("export", ckpt, tmp_path / "dir.onnx")
    assert "is the checkpoint itself" in refused("export", ckpt, ckpt, "--format", "torchscript")
    assert "drop --format" in refused("export", ckpt, tmp_path / "m.onnx", tmp_path / "m.ts", "--format", "onnx")
    assert "named twice" in refused("export", ckpt, tmp_path / "m.onnx", tmp_path / "x" / ".." / "m.onnx")
    assert "is a folder" in refused("export", ckpt, tmp_path / "m.onnx", tmp_path / "dir.onnx")  # none written
    code, out, err = cli("export", ckpt, tmp_path / "ok.ts", tmp_path / "fifo.onnx")  # refused at its write
    assert code == 2 and out.startswith(f"wrote {tmp_path / 'ok.ts'} (torchscript)") and "FIFO" in err
    (tmp_path / "ok.ts").unlink()  # whole, and said to be written before the refusal
    assert "is a FIFO" in refused("predict", "--checkpoint", tmp_path / "fifo.onnx", images[0])
    assert "is a folder" in refused("predict", "--checkpoint", tmp_path / "dir.onnx", images[0])
    assert "not found" in refused("predict", "--checkpoint", tmp_path / "missing.onnx", images[0])
    for bad in ("trunc.onnx", "noise.onnx"):
        assert "is not an ONNX model" in refused("predict", "--checkpoint", tmp_path / bad, images[0])
    assert "drop --config/--set" in refused("predict", "--checkpoint", exported / "m.onnx", "-c", "digits-lenet",
                                            images[0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("m.")]


@pytest.mark.slow
def test_no_write_through_a_link_out_of_the_run_or_out_of_outs_folder(run, tmp_path):  # noqa: F811
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.onnx").write_text("keep")
    before = tree_digest(outside)
    (run / "export").symlink_to(outside, target_is_directory=True)
    try:
        err = refused("export", run / "ckpt" / "mnist_cnn-best.pt", run / "export" / "m.onnx")
        assert "is a link out of the folder" in err and str(run / "export") in err
    finally:
        (run / "export").unlink()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "m.onnx").symlink_to(outside / "keep.onnx")
    assert "is a link out of the folder" in refused("export", run / "ckpt" / "mnist_cnn-best.pt",
                                                    tmp_path / "out" / "m.onnx")
    assert tree_digest(outside) == before


def tampered(exported: Path, tmp_path: Path, **props: str) -> Path:
    import onnx

    model = onnx.load_model_from_string((exported / "m.onnx").read_bytes())
    kept = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    for key, value in {**kept, **props}.items():
        if value is not None:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
    out = tmp_path / "tampered.onnx"
    out.write_bytes(model.SerializeToString())
    return out


@pytest.mark.parametrize("props, words", [
    ({"format": None}, "no torchboost metadata"),
    ({"std": "[0.5, 0.5]"}, "std is not 1 finite number"),
    ({"std": "[0]"}, "std holds a value outside [0.0001, 1000]"),
    ({"mean": "[NaN]"}, "mean is not 1 finite number"),
    ({"input_size": "[1, 16, 16]"}, "input_size"),
    ({"input_size": "[1, 8, 8]", "resize": "4"}, "no larger than the resize"),
    ({"classes": json.dumps([str(i) for i in range(9)])}, "metadata names 9 classes"),
    ({"classes": '["a", "a"]'}, "distinct names"),
    ({"classes": json.dumps([str(i) for i in range(9)] + ["x" * 256])}, "distinct names of 1 to 255 bytes"),
    ({"classes": "[" * 100_000}, "classes is not JSON"),
    ({"input_normalized": "false"}, "input_normalized"),
])
def test_tampered_onnx_metadata_is_refused_in_one_line(exported, images, tmp_path, props, words):
    bad = tampered(exported, tmp_path, **props)
    with pytest.raises(CheckpointError, match=words.replace("[", r"\[")):
        OnnxClassifier(bad)
    assert "\n" not in refused("predict", "--checkpoint", bad, images[0])


def test_an_onnx_file_pointing_at_external_data_is_refused_before_the_runtime_sees_it(exported, tmp_path):
    import onnx

    model = onnx.load_model_from_string((exported / "m.onnx").read_bytes())
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "/etc/hostname"), ("offset", "0")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    (tmp_path / "ext.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(CheckpointError, match="external file"):
        OnnxClassifier(tmp_path / "ext.onnx")


def test_a_missing_extra_is_named(run, exported, images, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    err = refused("predict", "--checkpoint", exported / "m.onnx", images[0])
    assert "onnxruntime is missing" in err and "pip install 'torchboost[export]'" in err
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    err = refused("export", run / "ckpt" / "mnist_cnn-best.pt", tmp_path / "m.onnx")
    assert "onnxscript is missing" in err and "pip install 'torchboost[export]'" in err
    assert not (tmp_path / "m.onnx").exists()
