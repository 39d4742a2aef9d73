"""Trust, round three: an ONNX model is untrusted code (docs/THREAT_MODEL.md, "exported .onnx models").

Hostile models are built with `onnx.helper` from a tiny valid classifier (1×8×8 input, two classes, a
torchboost export's metadata): control flow, external data wherever a tensor can sit (initializers, sparse
values and indices, node attributes, subgraphs, model-local functions), ops off the allow-list, outputs of
the wrong type or shape, huge dims, deep nesting, bad metadata values, and every kind of protobuf field of
nodes, functions, initializers and metadata mutated by a generator. Each goes through the real CLI
(`torchboost predict --checkpoint model.onnx image`) under an alarm and must give exactly one `error:` line,
exit 2, no traceback, no output, no hang, and change no file. Each hand-written case failed before its fix
(a hang, a file read into the logits, a traceback)."""

from __future__ import annotations

import copy
import math
import os
import random
import signal
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
from PIL import Image

from bounded import within
from test_trust import cli, tree_digest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from torchboost.deploy import OnnxClassifier, onnxproc  # noqa: E402
from torchboost.deploy.metadata import DeployInfo  # noqa: E402
from torchboost.errors import CheckpointError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
INFO = DeployInfo("tiny", ("cat", "dog"), 1, 8, 8, (0.5,), (0.25,), "test")
SECRET = np.array([0, 1], np.int64)  # what a file named by a model holds: read into the logits, it would show


def value(name: str, kind: int = T.FLOAT, shape=("batch", 2)):
    return h.make_tensor_value_info(name, kind, shape)


def classifier(nodes=None, inits=None, *, output=None, inputs=None, functions=(), opset=20):
    """input (N×1×8×8) -> Reshape N×64 -> Gemm -> `g`, then `nodes` (default: Identity to `logits`)."""
    base_inits = [nh.from_array(np.array([-1, 64], np.int64), "shape"),
                  nh.from_array(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64), "W"),
                  nh.from_array(np.zeros(2, np.float32), "b")]
    base = [h.make_node("Reshape", ["input", "shape"], ["flat"], name="reshape"),
            h.make_node("Gemm", ["flat", "W", "b"], ["g"], name="gemm", transB=1)]
    graph = h.make_graph(base + (nodes if nodes is not None else [h.make_node("Identity", ["g"], ["logits"])]),
                         "tiny", inputs or [value("input", T.FLOAT, ["batch", 1, 8, 8])],
                         [output or value("logits")], base_inits + list(inits or []))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], functions=list(functions))
    for key, text in INFO.to_props().items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
    return model


def external(t, location: str = "secret.bin"):
    """`t` with its data moved to the file `location` (as a model that points at a file would be)."""
    for field in ("raw_data", "float_data", "int64_data", "int32_data"):
        t.ClearField(field)
    t.data_location = T.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", location
    return t


def with_props(**props):
    model = classifier()
    kept = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    for key, text in {**kept, **props}.items():
        if text is not None:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, text
    return model


def body(*nodes, inputs=("i", "cond_in", "v_in"), outputs=("cond_out", "v_out")):
    """A Loop body: (iteration, condition, value) -> (condition, value)."""
    kinds = {"i": T.INT64, "cond_in": T.BOOL, "cond_out": T.BOOL}

    def declared(n: str):
        return h.make_tensor_value_info(n, kinds.get(n, T.FLOAT), [] if n in kinds else None)

    return h.make_graph(list(nodes) or [h.make_node("Identity", ["cond_in"], ["cond_out"]),
                                        h.make_node("Identity", ["v_in"], ["v_out"])], "body",
                        [declared(n) for n in inputs], [declared(n) for n in outputs])


def branch(out: str = "logits", inits=()):
    return h.make_graph([h.make_node("Identity", ["g"], [out])], "branch", [], [value(out)], list(inits))


def sparse(values_external: bool = False, indices_external: bool = False, name: str = "sp"):
    values = nh.from_array(np.ones(2, np.float32), name)
    indices = nh.from_array(SECRET, name + "_idx")
    return h.make_sparse_tensor(external(values) if values_external else values,
                                external(indices) if indices_external else indices, [2])


def with_sparse_init(values_external=False, indices_external=False):
    model = classifier([h.make_node("Add", ["g", "sp"], ["logits"])])
    model.graph.sparse_initializer.append(sparse(values_external, indices_external))
    return model


def nested(levels: int) -> bytes:
    """A model with Relu nodes each carrying the next graph as a GRAPH attribute, `levels` deep, written as
    bytes by hand (protobuf itself builds no message nested past 100 levels)."""
    graph = b""
    for _ in range(levels):
        attribute = h.make_attribute("g", 0)  # name and type GRAPH, then field 6 (g) appended
        attribute.ClearField("i")
        attribute.type = onnx.AttributeProto.GRAPH
        node = h.make_node("Relu", ["g"], ["logits"]).SerializeToString()
        if graph:
            node += _field(5, attribute.SerializeToString() + _field(6, graph))  # NodeProto.attribute
        graph = _field(1, node)  # GraphProto.node
    return classifier([]).SerializeToString() + _field(7, graph)  # ModelProto.graph, merged into the first


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: key, length, bytes."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def function_model(nodes, attribute_protos=()):
    fn = h.make_function("local", "f", ["x"], ["y"], nodes, [h.make_opsetid("", 20)],
                         attribute_protos=list(attribute_protos))
    return classifier([h.make_node("Relu", ["g"], ["logits"])], functions=[fn])


def slow_model(layers: int = 200):
    """Allowed ops only, and a long run in little memory: the input padded to 64×64, widened to 256 channels,
    then `layers` 3×3 convolutions sharing one 2.4 MB kernel (~5 GFLOP each: minutes on one thread)."""
    inits = [i64("pads", [0, 0, 28, 28, 0, 0, 28, 28]), nh.from_array(np.full((256, 1, 1, 1), 0.1, np.float32), "W0"),
             nh.from_array(np.full((256, 256, 3, 3), 1e-4, np.float32), "K"),
             nh.from_array(np.ones((256, 2), np.float32), "W1")]
    nodes = [h.make_node("Pad", ["input", "pads"], ["padded"]), h.make_node("Conv", ["padded", "W0"], ["x0"])]
    nodes += [h.make_node("Conv", [f"x{i}", "K"], [f"x{i + 1}"], pads=[1, 1, 1, 1]) for i in range(layers)]
    nodes += [h.make_node("GlobalAveragePool", [f"x{layers}"], ["pooled"]), h.make_node("Flatten", ["pooled"], ["f"]),
              h.make_node("Gemm", ["f", "W1"], ["logits"])]
    graph = h.make_graph(nodes, "slow", [value("input", T.FLOAT, ["batch", 1, 8, 8])], [value("logits")], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20)])
    for key, text in INFO.to_props().items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
    return model


def i64(name: str, values):
    return nh.from_array(np.array(values, np.int64), name)


# name -> a hostile model (a ModelProto, or bytes), grouped by what it attacks
HOSTILE: dict[str, Callable[[], object]] = {
    # control flow, anywhere
    "Loop of 2^62 iterations": lambda: classifier(
        [h.make_node("Loop", ["M", "c", "g"], ["logits"], body=body())],
        [i64("M", 2**62), nh.from_array(np.array(True), "c")]),
    "If": lambda: classifier([h.make_node("If", ["c"], ["logits"], then_branch=branch(), else_branch=branch())],
                             [nh.from_array(np.array(True), "c")]),
    "Scan": lambda: classifier([h.make_node(
        "Scan", ["g"], ["logits"], num_scan_inputs=1, body=h.make_graph(
            [h.make_node("Identity", ["x"], ["y"])], "b", [value("x", T.FLOAT, [2])], [value("y", T.FLOAT, [2])]))]),
    "Loop in a subgraph of an allowed op": lambda: classifier([h.make_node(
        "Relu", ["g"], ["logits"], g=h.make_graph([h.make_node("Loop", ["M", "c", "g"], ["logits"], body=body())],
                                                   "sub", [], [value("logits")]))], [i64("M", 2**62)]),
    "Loop in a model-local function": lambda: function_model(
        [h.make_node("Loop", ["M", "c", "x"], ["y"], body=body())]),
    # external data wherever a tensor can sit
    "external initializer": lambda: classifier(None, [external(nh.from_array(np.ones(2, np.float32), "extra"))]),
    "external entries without the EXTERNAL flag": lambda: classifier(None, [_entries_only()]),
    "EXTERNAL flag without entries": lambda: classifier(None, [_flag_only()]),
    "external sparse initializer values": lambda: with_sparse_init(values_external=True),
    "external sparse initializer indices": lambda: with_sparse_init(indices_external=True),
    "external Constant attribute": lambda: classifier([
        h.make_node("Constant", [], ["k"], value=external(nh.from_array(np.ones(2, np.float32), "k"))),
        h.make_node("Add", ["g", "k"], ["logits"])]),
    "external sparse Constant attribute (indices)": lambda: classifier([
        h.make_node("Constant", [], ["k"], sparse_value=sparse(indices_external=True)),
        h.make_node("Add", ["g", "k"], ["logits"])]),
    "external TENSORS attribute": lambda: classifier([h.make_node(
        "Relu", ["g"], ["logits"], ts=[external(nh.from_array(np.ones(2, np.float32), "t"))])]),
    "external SPARSE_TENSORS attribute": lambda: classifier([h.make_node(
        "Relu", ["g"], ["logits"], sts=[sparse(values_external=True)])]),
    "external initializer in a subgraph": lambda: classifier([h.make_node(
        "Relu", ["g"], ["logits"], g=branch(inits=[external(nh.from_array(np.ones(2, np.float32), "e"))]))]),
    "external initializer in a GRAPHS attribute": lambda: classifier([h.make_node(
        "Relu", ["g"], ["logits"],
        gs=[branch(), branch(inits=[external(nh.from_array(np.ones(2, np.float32), "e"))])])]),
    "external Constant in a model-local function": lambda: function_model([
        h.make_node("Constant", [], ["k"], value=external(nh.from_array(np.ones(2, np.float32), "k"))),
        h.make_node("Add", ["x", "k"], ["y"])]),
    "external sparse Constant in a model-local function": lambda: function_model([
        h.make_node("Constant", [], ["k"], sparse_value=sparse(indices_external=True)),
        h.make_node("Add", ["x", "k"], ["y"])]),
    "external attribute default of a model-local function": lambda: function_model(
        [h.make_node("Relu", ["x"], ["y"])],
        [h.make_attribute("w", external(nh.from_array(np.ones(2, np.float32), "w")))]),
    "training graphs": lambda: _training(),
    # ops off the allow-list
    "Cast to int64": lambda: classifier([h.make_node("Cast", ["g"], ["logits"], to=T.INT64)],
                                        output=value("logits", T.INT64)),
    "ConstantOfShape": lambda: classifier([h.make_node("ConstantOfShape", ["shape"], ["logits"])]),
    "RandomNormalLike": lambda: classifier([h.make_node("RandomNormalLike", ["g"], ["logits"])]),
    "a contrib op": lambda: classifier([h.make_node("FusedGemm", ["flat", "W", "b"], ["logits"],
                                                    domain="com.microsoft")]),
    "an op of an unknown domain": lambda: classifier([h.make_node("Exec", ["g"], ["logits"], domain="evil")]),
    "a call of a model-local function": lambda: _calls_function(),
    "an op named with controls": lambda: classifier([h.make_node("Relu\n\x1b[2Jerror: forged" + "x" * 10_000,
                                                                 ["g"], ["logits"])]),
    # the output: type, rank, size
    "int64 output": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])], [i64("k", [[1, 2]])],
                                       output=value("logits", T.INT64)),
    "bool output": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])],
                                      [nh.from_array(np.array([[True, False]]), "k")], output=value("logits", T.BOOL)),
    "string output": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])],
                                        [h.make_tensor("k", T.STRING, [1, 2], [b"a", b"b"])],
                                        output=value("logits", T.STRING)),
    "double output": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])],
                                        [nh.from_array(np.zeros((1, 2)), "k")], output=value("logits", T.DOUBLE)),
    "int64 output declared float": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])],
                                                      [i64("k", [[1, 2]])]),
    "sequence output": lambda: classifier(
        output=h.make_tensor_sequence_value_info("logits", T.FLOAT, ["batch", 2])),
    "rank-1 output": lambda: classifier(output=value("logits", T.FLOAT, ["n"])),
    "rank-3 output": lambda: classifier(output=value("logits", T.FLOAT, ["batch", 2, 1])),
    "three classes declared": lambda: classifier(output=value("logits", T.FLOAT, ["batch", 3])),
    "three classes given": lambda: _three_classes(),
    "a constant batch of outputs": lambda: classifier([h.make_node("Identity", ["k"], ["logits"])],
                                                      [nh.from_array(np.zeros((5, 2), np.float32), "k")],
                                                      output=value("logits", T.FLOAT, ["n", "c"])),
    "two outputs": lambda: _two_outputs(),
    "int64 input": lambda: classifier(inputs=[value("input", T.INT64, ["batch", 1, 8, 8])]),
    "input of another size": lambda: classifier(inputs=[value("input", T.FLOAT, ["batch", 1, 16, 16])]),
    # huge dims
    "input dim 2^62": lambda: classifier(inputs=[value("input", T.FLOAT, ["batch", 1, 8, 2**62])]),
    "value_info dim 2^62": lambda: _value_info(2**62),
    "Reshape to 2^31×2^31": lambda: classifier([h.make_node("Reshape", ["g", "big"], ["logits"])],
                                               [i64("big", [2**31, 2**31])]),
    "Pad by 2^40": lambda: classifier([h.make_node("Pad", ["g", "pads"], ["logits"])], [i64("pads", [0, 2**40, 0, 0])]),
    "a 16 GiB broadcast": lambda: classifier([h.make_node("Add", ["row", "col"], ["big"]),
                                              h.make_node("ReduceMean", ["big"], ["m"], keepdims=1),
                                              h.make_node("Add", ["g", "m"], ["logits"])],
                                             [nh.from_array(np.ones((1, 65536), np.float32), "row"),
                                              nh.from_array(np.ones((65536, 1), np.float32), "col")]),
    "an initializer claiming 2^62 values": lambda: classifier(None, [_claims(2**62)]),
    # nesting and size
    "graphs nested 6 deep": lambda: nested(6),
    "graphs nested 150 deep": lambda: nested(150),
    "200,001 initializers": lambda: classifier(None, [nh.from_array(np.zeros(0, np.float32), f"e{i}")
                                                      for i in range(200_001)]),
    # metadata values
    "no metadata": lambda: with_props(format=None),
    "a mean of 5,001 digits": lambda: with_props(mean="[" + "1" * 5001 + "]"),
    "a mean of 400 digits": lambda: with_props(mean="[" + "1" * 400 + "]"),
    "a std of 1e999": lambda: with_props(std="[1e999]"),
    "a resize of 2^62": lambda: with_props(resize=str(2**62)),
    "an input size of 5,001 digits": lambda: with_props(input_size="[1, 8, " + "8" * 5001 + "]"),
    "classes nested 100,000 deep": lambda: with_props(classes="[" * 100_000),
    "a metadata value over the cap": lambda: with_props(classes='["' + "c" * (1 << 22) + '"]'),
    "a class named with controls (and one missing)": lambda: with_props(classes='["cat\\nerror: forged"]'),
    "a std of 5e-324": lambda: with_props(std="[5e-324]"),
    "an input of 4096 pixels a side": lambda: with_props(input_size="[1, 4096, 4096]", resize="4096"),
    "a model name of 300 characters with ESC": lambda: with_props(model="m\x1b[2J" * 60),
    "a mean of 1e300": lambda: with_props(mean="[1e300]"),
    "the classes key twice (the last reversed)": lambda: _twice("classes", '["dog", "cat"]'),
    # allowed ops whose outputs are no numbers: never printed as probabilities
    "Sqrt of -1": lambda: classifier([h.make_node("Mul", ["g", "zero"], ["z"]), h.make_node("Add", ["z", "m1"], ["n"]),
                                      h.make_node("Sqrt", ["n"], ["logits"])],
                                     [nh.from_array(np.zeros(1, np.float32), "zero"),
                                      nh.from_array(-np.ones(1, np.float32), "m1")]),
    "a division by zero": lambda: classifier([h.make_node("Div", ["g", "zero"], ["logits"])],
                                             [nh.from_array(np.zeros(1, np.float32), "zero")]),
    "Gemm alpha NaN": lambda: _gemm_alpha(float("nan")),
    # other fields
    "opset 10^6": lambda: classifier(opset=10**6),
    "ir_version 10^6": lambda: _set(classifier(), ir_version=10**6),
    "a cycle": lambda: classifier([h.make_node("Add", ["g", "loop"], ["loop"]),
                                   h.make_node("Identity", ["loop"], ["logits"])]),
    "an undefined input": lambda: classifier([h.make_node("Add", ["g", "nowhere"], ["logits"])]),
    "a short initializer": lambda: classifier([h.make_node("Add", ["g", "short"], ["logits"])], [_short()]),
    "truncated bytes": lambda: classifier().SerializeToString()[:300],
    "not protobuf": lambda: b"\xff" * 64,
}


def _twice(key: str, text: str):
    model = classifier()
    entry = model.metadata_props.add()
    entry.key, entry.value = key, text
    return model


def _gemm_alpha(alpha: float):
    model = classifier()
    model.graph.node[1].attribute.append(h.make_attribute("alpha", alpha))
    return model


def _entries_only():
    t = external(nh.from_array(np.ones(2, np.float32), "extra"))
    t.data_location = T.DEFAULT
    return t


def _flag_only():
    t = external(nh.from_array(np.ones(2, np.float32), "extra"))
    del t.external_data[:]
    return t


def _training():
    model = classifier()
    model.training_info.add().initialization.CopyFrom(branch())
    return model


def _calls_function():
    fn = h.make_function("local", "f", ["x"], ["y"], [h.make_node("Relu", ["x"], ["y"])], [h.make_opsetid("", 20)])
    model = classifier([h.make_node("f", ["g"], ["logits"], domain="local")], functions=[fn])
    model.opset_import.append(h.make_opsetid("local", 1))
    return model


def _three_classes():
    model = classifier(output=value("logits", T.FLOAT, ["batch", "classes"]))
    model.graph.initializer[1].CopyFrom(nh.from_array(np.ones((3, 64), np.float32), "W"))
    model.graph.initializer[2].CopyFrom(nh.from_array(np.zeros(3, np.float32), "b"))
    return model


def _two_outputs():
    model = classifier()
    model.graph.output.append(value("g"))
    return model


def _value_info(dim: int):
    model = classifier()
    model.graph.value_info.append(value("flat", T.FLOAT, ["batch", dim]))
    return model


def _claims(n: int):
    t = T()
    t.name, t.data_type = "claim", T.FLOAT
    t.dims.append(n)
    return t


def _short():
    t = nh.from_array(np.ones(2, np.float32), "short")
    t.dims[0] = 1000
    return t


def _set(model, **fields):
    for key, v in fields.items():
        setattr(model, key, v)
    return model


@pytest.fixture
def place(tmp_path, monkeypatch) -> Path:
    """The working folder, holding an image and the file a model might name, beside a folder `outside`; the
    child's memory capped at 2 GiB, so that a graph asking for gigabytes fails at once on a shared machine."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    for folder in (work, outside):
        folder.mkdir()
        (folder / "secret.bin").write_bytes(SECRET.tobytes())
    monkeypatch.chdir(work)
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).save(work / "img.png")
    monkeypatch.setattr(onnxproc, "memory_cap", lambda: 2 << 30)
    return work


def predict(place: Path, model) -> tuple[int, str, list[str]]:
    """(exit code, stdout, non-blank stderr lines) of `predict` on `model` (a ModelProto or bytes), under an
    alarm; no traceback, and no file under the test's folder changed."""
    path = place / "model.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    before = tree_digest(place.parent)
    code, out, err = cli("predict", "--checkpoint", path, place / "img.png", seconds=60)
    assert "Traceback" not in err and tree_digest(place.parent) == before, err[:2000]
    return code, out, [line for line in err.splitlines() if line.strip()]


def refused_model(place: Path, model) -> str:
    """The one error line `predict` gives for `model`: exit 2, nothing printed."""
    code, out, lines = predict(place, model)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not out, (code, out, lines)
    assert len(lines[0]) < 2000
    return lines[0]


def prediction_or_one_line(place: Path, model) -> None:
    """Either one prediction line (the model stayed valid) or one error line."""
    code, out, lines = predict(place, model)
    if code == 0:
        assert not lines and out.count("\n") == 1 and out.startswith(str(place / "img.png")), (out, lines)
    else:
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not out, (code, out, lines)


def test_the_tiny_classifier_is_accepted(place):
    (place / "ok.onnx").write_bytes(classifier().SerializeToString())
    code, out, err = cli("predict", "--checkpoint", place / "ok.onnx", place / "img.png")
    assert code == 0 and out.startswith(f"{place / 'img.png'}: ") and not err.strip(), (code, out, err)


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.slow
def test_a_hostile_model_is_one_line(place, name):
    err = refused_model(place, HOSTILE[name]())
    if "external" in name:
        assert "external file" in err  # refused for what it is, before the runtime could read the file
    if any(word in name for word in ("Loop", "If", "Scan")) and "function" not in name:
        assert "control flow" in err
    if name.startswith(("Cast", "ConstantOfShape", "RandomNormalLike", "a contrib", "an op of")):
        assert "allow-list" in err
    if name in ("Sqrt of -1", "a division by zero", "Gemm alpha NaN"):  # printed as probabilities before
        assert "not a finite number" in err and "model.onnx" in err and "img.png" in err
    if name in ("a std of 5e-324", "a mean of 1e300"):
        assert "outside [" in err
    if name == "an input of 4096 pixels a side":
        assert "as a checkpoint's data.image_size" in err
    if "twice" in name:
        assert "'classes' twice" in err


# Every kind of protobuf field of nodes, functions, initializers (dense and sparse), metadata and the graph's
# signature, mutated by a generator: a seeded sample of each (area, kind) group.
def kitchen_sink():
    """A valid model holding every part a mutation can reach: a sparse initializer, a Constant node with an
    attribute, a model-local function (never called) with an attribute default."""
    model = classifier([h.make_node("Constant", [], ["k"], value=nh.from_array(np.zeros(2, np.float32), "kv")),
                        h.make_node("Add", ["g", "k"], ["g2"]), h.make_node("Add", ["g2", "sp"], ["logits"])],
                       functions=[h.make_function("local", "f", ["x"], ["y"], [h.make_node("Relu", ["x"], ["y"])],
                                                  [h.make_opsetid("", 20)],
                                                  attribute_protos=[h.make_attribute("alpha", 0.5)])])
    model.graph.sparse_initializer.append(sparse())
    return model


def fields(msg, path=()) -> Iterator[tuple[tuple, object]]:
    """(path to the message holding it, field descriptor) of every field set in `msg`, depth first."""
    for fd, _ in msg.ListFields():
        yield path, fd
        if fd.type == fd.TYPE_MESSAGE:
            items = getattr(msg, fd.name) if fd.is_repeated else [getattr(msg, fd.name)]
            for i, item in enumerate(items):
                yield from fields(item, path + ((fd.name, i if fd.is_repeated else None),))


def area(path: tuple) -> str:
    names = [p[0] for p in path]
    for key, words in (("function", ("functions",)), ("metadata", ("metadata_props",)),
                       ("initializer", ("initializer", "sparse_initializer")), ("node", ("node",)),
                       ("signature", ("input", "output", "value_info"))):
        if any(w in names for w in words):
            return key
    return "model"


def mutations(fd) -> list[Callable]:
    """Ways to break one field: extreme numbers, hostile text, other enum values, cleared or doubled."""
    INT_LIMITS = {fd.TYPE_INT32: (-2**31, 2**31 - 1), fd.TYPE_INT64: (-2**63, 2**63 - 1),
                  fd.TYPE_UINT64: (0, 2**64 - 1), fd.TYPE_UINT32: (0, 2**32 - 1)}
    repeated = fd.is_repeated

    def put(v):
        return (lambda m: getattr(m, fd.name).append(v)) if repeated else (lambda m: setattr(m, fd.name, v))

    if fd.type == fd.TYPE_MESSAGE:
        return [lambda m: m.ClearField(fd.name)] + ([lambda m: getattr(m, fd.name).append(getattr(m, fd.name)[0])]
                                                    if repeated else [])
    out = [lambda m: m.ClearField(fd.name)]
    if fd.type in INT_LIMITS:
        lo, hi = INT_LIMITS[fd.type]
        out += [put(lo), put(hi), put(-1 if lo < 0 else 0)]
    elif fd.type == fd.TYPE_STRING:
        out += [put(""), put("\u202e\nerror: forged\x1b[2J"), put("n" * 70_000)]
    elif fd.type == fd.TYPE_BYTES:
        out += [put(b""), put(b"\xff" * 7)]
    elif fd.type in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
        out += [put(math.nan), put(math.inf), put(-1e38)]
    elif fd.type == fd.TYPE_ENUM:
        out += [put(v.number) for v in fd.enum_type.values]
    return out


def generated(per_group: int = 3, seed: int = 0) -> list[tuple[str, Callable]]:
    base = kitchen_sink()
    groups: dict[tuple[str, str], list] = {}
    for path, fd in fields(base):
        kind = "message" if fd.type == fd.TYPE_MESSAGE else fd.type
        for i, mutate in enumerate(mutations(fd)):
            groups.setdefault((area(path), str(kind)), []).append((f"{'.'.join(p[0] for p in path)}.{fd.name}#{i}",
                                                                   path, mutate))
    rng = random.Random(seed)
    chosen = []
    for _, items in sorted(groups.items()):
        chosen += rng.sample(items, min(per_group, len(items)))
    return [(name, _apply(base, path, mutate)) for name, path, mutate in chosen]


def _apply(base, path: tuple, mutate: Callable) -> Callable:
    def build():
        model = copy.deepcopy(base)
        msg = model
        for name, i in path:
            msg = getattr(msg, name)[i] if i is not None else getattr(msg, name)
        try:
            mutate(msg)
        except (ValueError, TypeError):  # a value this field cannot hold at all: the base, unchanged
            pass
        return model
    return build


GENERATED = generated()


@pytest.mark.parametrize("name, build", GENERATED, ids=[name for name, _ in GENERATED])
def test_any_field_of_a_model_mutated_is_a_prediction_or_one_line(place, name, build):
    prediction_or_one_line(place, build())


@pytest.mark.slow
def test_random_byte_flips_are_a_prediction_or_one_line(place):
    data = kitchen_sink().SerializeToString()
    rng = random.Random(0)
    for _ in range(25):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        prediction_or_one_line(place, bytes(flipped))


def test_a_graph_that_runs_too_long_is_stopped_at_the_deadline(place, monkeypatch):
    monkeypatch.setattr(onnxproc, "RUN_SECONDS", 1.0)
    with within(30, "a 1 s deadline"):  # fails while the call still runs, not after it returns
        err = refused_model(place, slow_model())
    assert "did not finish running the model within 1 s" in err


def test_ctrl_c_ends_a_long_run_at_once_and_leaves_no_process(place, monkeypatch):
    started = []
    popen = onnxproc.subprocess.Popen
    monkeypatch.setattr(onnxproc.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1])
    (place / "slow.onnx").write_bytes(slow_model().SerializeToString())
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    # what a terminal's Ctrl-C meets: Python's KeyboardInterrupt (a pytest-xdist worker ignores SIGINT, the
    # controller's to handle, so this test puts Python's default handler back for its own duration)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer.start()
    try:  # the alarm is the bound: Ctrl-C at 2 s must end the command well before 10 s
        code, out, err = cli("predict", "--checkpoint", place / "slow.onnx", place / "img.png", seconds=10)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    assert code == 130 and "interrupted" in err and not out
    assert started and all(p.poll() is not None for p in started)  # the child was killed, not left running


def test_the_terminals_ctrl_c_ends_the_child_itself(place):
    """SIGINT to the child (the terminal sends it to the whole group) ends it: it keeps SIGINT's default action,
    which no node can delay. The next batch is one line, not a hang."""
    (place / "ok.onnx").write_bytes(classifier().SerializeToString())
    model = OnnxClassifier(place / "ok.onnx")
    os.kill(model._process.proc.pid, signal.SIGINT)
    model._process.proc.wait(10)
    with pytest.raises(CheckpointError, match="ended ONNX Runtime's process while running the model"):
        model.logits(np.zeros((1, 1, 8, 8), np.float32))


def test_outputs_are_checked_before_use(place):
    (place / "three.onnx").write_bytes(_three_classes().SerializeToString())
    model = OnnxClassifier(place / "three.onnx")
    with pytest.raises(CheckpointError, match=r"gave float32 outputs of shape \[2, 3\], not float32 logits of shape "
                                              r"\[2, 2\]"):
        model.logits(np.zeros((2, 1, 8, 8), np.float32))
    ok = OnnxClassifier(_saved(place, classifier()))
    logits = ok.logits(np.ones((3, 1, 8, 8), np.float32))
    assert logits.shape == (3, 2) and logits.dtype == np.float32 and logits.flags.writeable
    ok.close()
    with pytest.raises(CheckpointError, match="has ended"):
        ok.logits(np.ones((1, 1, 8, 8), np.float32))


def _saved(place: Path, model) -> Path:
    path = place / "saved.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_a_module_in_the_working_folder_is_never_imported(place):
    """The child runs `python -I` with the parent's path: a numpy.py beside the images is not imported."""
    (place / "numpy.py").write_text("raise SystemExit('imported from the working folder')\n")
    (place / "onnxruntime.py").write_text("raise SystemExit('imported from the working folder')\n")
    (place / "ok.onnx").write_bytes(classifier().SerializeToString())
    code, out, err = cli("predict", "--checkpoint", place / "ok.onnx", place / "img.png")
    assert code == 0 and (": cat " in out or ": dog " in out), (code, out, err)


def test_the_zoo_list_is_inside_the_allow_list_and_holds_no_control_flow():
    """ZOO_OPS is what the project's exporter makes of its networks: tests/test_zoo_generator.py exports every zoo
    network (at 32 and 100 px) and checks its graph holds nothing else; here, that list is one `predict` accepts."""
    from torchboost.deploy.onnxcheck import ALLOWED_OPS, CONTROL_FLOW, ZOO_OPS

    assert ZOO_OPS <= ALLOWED_OPS and not CONTROL_FLOW & ALLOWED_OPS
