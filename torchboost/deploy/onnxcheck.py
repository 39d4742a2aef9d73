"""What an .onnx file may hold before ONNX Runtime sees it: an image classifier's graph, nothing more.

An ONNX model is a program, not a data file. A 1 kB model with a `Loop` of 2^62 iterations runs for ever; a
tensor marked as external data makes the runtime read a file the model names (from the working folder, into the
logits), wherever the tensor sits: an initializer, a sparse initializer's values or indices, a node attribute,
a subgraph, a model-local function; an op of another domain runs whatever the runtime registered under it. So
every graph, subgraph (GRAPH / GRAPHS attributes), model-local function (its nodes and attribute defaults) and
tensor (dense; sparse: values and indices) is walked, within `MAX_DEPTH` levels and `MAX_PARTS` parts, and the
model is refused unless

- no tensor keeps its data outside the file (`data_location` EXTERNAL, or any `external_data` entry);
- no tensor, sparse tensor (its dense shape) or declared value has a dimension past `MAX_DIM` or more than
  `MAX_VALUES` values (a huge claimed shape is a corrupt file; the runtime would allocate what it says);
- it holds no training graphs, and every node is an op of the default ONNX domain on `ALLOWED_OPS`: no
  control flow (`Loop`, `If`, `Scan`), no contrib or custom op, no call of a model-local function;
- it takes one float32 N×C×H×W input (the size its metadata records) and gives one float32 N×classes output
  (`check_signature`; the array each run gives is checked again where it is used, `onnxrun`).

The allow-list, `ALLOWED_OPS`: what torch's exporter (`deploy/export.py`, its default `optimize=True`) emits for
every network of the zoo at input sizes whose feature maps end at 1×1 and larger (`ZOO_OPS`, listed by exporting
each, and checked so by tests/test_zoo_generator.py; BatchNorm is folded into Conv, except airbench's, which
follows a max-pool; its global max-pool is a ReduceMax; ConvNeXt's pooling of a map
larger than 1×1 reads the batch size through Shape, Range and Gather), what the same networks give unoptimised or
from the older TorchScript exporter (`EXPORTER_OPS`), and a few elementwise and shape ops common in image
classifiers (`COMMON_OPS`). None of them loops or reads anything but its inputs. What one of them can still ask
for (a Pad, a Range or a broadcast that makes gigabytes from a few numbers) is bounded where the graph runs, in a
child process with a memory cap and a deadline (`onnxproc`).
"""

from __future__ import annotations

import math
from typing import Any

from torchboost.errors import CheckpointError

ZOO_OPS = frozenset({"Add", "BatchNormalization", "Conv", "Gather", "Gelu", "Gemm", "HardSigmoid", "HardSwish",
                     "LayerNormalization", "MatMul", "MaxPool", "Mul", "Pad", "Range", "ReduceMax", "ReduceMean",
                     "Relu", "Reshape", "Shape", "Sigmoid", "Slice", "Squeeze", "Transpose", "Unsqueeze"})
EXPORTER_OPS = frozenset({"AveragePool", "Constant", "Flatten", "GlobalAveragePool", "Identity"})
COMMON_OPS = frozenset({"Clip", "Concat", "Div", "Erf", "GlobalMaxPool", "LeakyRelu", "Softmax", "Sqrt", "Sub",
                        "Tanh"})
ALLOWED_OPS = ZOO_OPS | EXPORTER_OPS | COMMON_OPS
CONTROL_FLOW = frozenset({"Loop", "If", "Scan"})
DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_DEPTH = 4  # graph nesting: an exported classifier has one graph (subgraphs only hang under control flow)
MAX_PARTS = 200_000  # nodes, attributes, tensors and declared values walked (ResNet-152: about 4,000)
MAX_DIM = (1 << 31) - 1  # a dimension past this is a corrupt value, not a network's
MAX_VALUES = 1 << 31  # values in one tensor (the whole file holds at most 2 GiB)
FIX = "pass an .onnx file written by `torchboost export`"


def check_graph(proto: Any, source: str) -> None:
    """CheckpointError naming `source` for the first thing in the ModelProto `proto` that an exported image
    classifier never holds (see the module docstring): external data, then sizes, then ops."""
    from onnx import TensorProto

    parts = _Parts(source)
    parts.walk(proto)
    for where, tensor in parts.tensors:
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            raise CheckpointError(f"{source} keeps tensor {_cut(tensor.name)!r} ({where}) in an external file, "
                                  "which is never read", "export it again with `torchboost export` (one "
                                  "self-contained file)")
    for where, dims in parts.shapes:
        if any(not 0 <= d <= MAX_DIM for d in dims) or math.prod(dims) > MAX_VALUES:
            raise CheckpointError(f"{source} declares a tensor of shape {_shape(dims)} ({where}), more than an "
                                  "image classifier holds", FIX)
    if len(proto.training_info):
        raise CheckpointError(f"{source} holds training graphs, which an exported classifier never does", FIX)
    for where, node in parts.nodes:
        op, domain = _cut(node.op_type), _cut(node.domain)
        if domain in DEFAULT_DOMAINS and op in CONTROL_FLOW:
            raise CheckpointError(f"{source} holds control flow ({op}, {where}), which can run for ever", FIX)
        if domain not in DEFAULT_DOMAINS or op not in ALLOWED_OPS:
            named = f"{domain}.{op}" if domain else op
            raise CheckpointError(f"{source} uses the op {named!r} ({where}), which is not on the allow-list of "
                                  f"image classifier ops ({', '.join(sorted(ALLOWED_OPS))})", FIX)


def check_signature(graph: Any, input_size: tuple[int, int, int], classes: int, source: str) -> str:
    """The name of the graph's one input, once its declared type is float32 N×C×H×W of `input_size` and its
    one output's float32 N×`classes`: CheckpointError naming `source` otherwise."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{source} {what}", FIX)

    stored = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = [v for v in graph.input if v.name not in stored]  # an initializer may be listed as an input
    if len(inputs) != 1 or len(graph.output) != 1:
        raise bad(f"takes {len(inputs)} input(s) and gives {len(graph.output)} output(s), not one of each")
    kind, dims = _tensor_type(inputs[0])
    if kind != "FLOAT" or len(dims) != 4 or dims[1:] != list(input_size):
        raise bad(f"takes {kind} of shape {_shape(dims)} but its metadata says FLOAT N×"
                  f"{'×'.join(map(str, input_size))}")
    kind, dims = _tensor_type(graph.output[0])
    if kind != "FLOAT":
        raise bad(f"gives {kind} outputs, not FLOAT logits")
    if len(dims) != 2 or (isinstance(dims[1], int) and dims[1] != classes):
        raise bad(f"gives outputs of shape {_shape(dims)} but its metadata names {classes} classes")
    return inputs[0].name


class _Parts:
    """Every tensor (with where it sits), node and declared shape of a model, gathered by `walk` from every
    graph, subgraph and model-local function, refused past MAX_DEPTH levels or MAX_PARTS parts before it is
    walked further."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.tensors: list[tuple[str, Any]] = []  # dense tensors, sparse ones' values and indices
        self.nodes: list[tuple[str, Any]] = []
        self.shapes: list[tuple[str, list[int]]] = []  # tensors' dims and declared dims (numbers only)
        self.parts = 0

    def walk(self, proto: Any) -> None:
        self.graph(proto.graph, "main graph", 0)
        for f in proto.functions:
            where = f"function {_cut(f.name)!r}"
            self.count(len(f.node) + len(f.attribute_proto))
            for node in f.node:
                self.node(node, where, 1)
            for a in f.attribute_proto:  # attribute defaults: tensors and graphs too
                self.attribute(a, where, 1)
        self.shapes += [(where, list(t.dims)) for where, t in self.tensors]

    def count(self, n: int) -> None:
        self.parts += n
        if self.parts > MAX_PARTS:
            raise CheckpointError(f"{self.source} holds more than {MAX_PARTS:,} nodes, attributes and tensors",
                                  FIX)

    def graph(self, g: Any, where: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"{self.source} nests graphs more than {MAX_DEPTH} levels deep", FIX)
        declared = [*g.input, *g.output, *g.value_info]
        self.count(len(g.initializer) + len(g.sparse_initializer) + len(g.node) + len(declared))
        self.tensors += [(where, t) for t in g.initializer]
        self.sparse(g.sparse_initializer, where)
        self.shapes += [(where, [d.dim_value for d in v.type.tensor_type.shape.dim if d.HasField("dim_value")])
                        for v in declared]
        for node in g.node:
            self.node(node, where, depth)

    def node(self, node: Any, where: str, depth: int) -> None:
        self.nodes.append((where, node))
        for a in node.attribute:
            self.attribute(a, f"{where}, node {_cut(node.name or node.op_type)!r}", depth)

    def attribute(self, a: Any, where: str, depth: int) -> None:
        self.count(1 + len(a.tensors) + len(a.sparse_tensors) + len(a.graphs))
        self.tensors += [(where, t) for t in [*([a.t] if a.HasField("t") else []), *a.tensors]]
        self.sparse([*([a.sparse_tensor] if a.HasField("sparse_tensor") else []), *a.sparse_tensors], where)
        for sub in [*([a.g] if a.HasField("g") else []), *a.graphs]:
            self.graph(sub, f"{where}, subgraph {_cut(sub.name)!r}", depth + 1)

    def sparse(self, tensors: Any, where: str) -> None:
        """A sparse tensor: its values and indices, and the dense shape the runtime would make of it."""
        for s in tensors:
            self.tensors += [(where, s.values), (where, s.indices)]
            self.shapes.append((where, list(s.dims)))


def _tensor_type(value: Any) -> tuple[str, list[int | str]]:
    """(element type name, dims: a number, a parameter name or "?") of a tensor-typed ValueInfoProto;
    (SEQUENCE, MAP, OPTIONAL..., []) for another type."""
    from onnx import TensorProto

    if not value.type.HasField("tensor_type"):
        return (value.type.WhichOneof("value") or "untyped").replace("_type", "").upper(), []
    t = value.type.tensor_type
    try:
        kind = TensorProto.DataType.Name(t.elem_type)
    except ValueError:
        kind = f"element type {t.elem_type}"
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else _cut(d.dim_param) or "?"
                             for d in t.shape.dim]
    return kind, dims


def _shape(dims: list[int | str]) -> str:
    return "[" + ", ".join(map(str, dims[:8])) + (", …]" if len(dims) > 8 else "]")


def _cut(text: str) -> str:
    """A name from the file, cut to a length a message can quote (printing makes it one line)."""
    return text if len(text) <= 60 else text[:60] + "…"
