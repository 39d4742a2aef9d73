"""An exported ONNX classifier run through ONNX Runtime, its preprocessing read from its own metadata.

The file is untrusted: a regular file only (a FIFO is refused, never waited on), read whole up to ONNX's own
2 GiB limit, parsed and checked before ONNX Runtime sees it: no tensor may point at external data (a path
the file names: ONNX Runtime 1.30 refuses one in a model given as bytes, with a message about model paths;
this says which tensor, whatever the runtime's version does), the metadata must be a torchboost export's
(`DeployInfo.from_props`), and the graph must take float32 N×C×H×W of the size the metadata says and give
one logit per recorded class. The session is built from
the checked bytes, never from the path (no second read of a file that may have changed).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from torchboost.deploy.metadata import DeployInfo
from torchboost.errors import CheckpointError, ConfigError, printable
from torchboost.fileio import open_regular

MAX_BYTES = (1 << 31) - 1  # protobuf's limit on one message: a larger .onnx keeps its weights outside
EXTRA = "pip install 'torchboost[export]'"


class OnnxClassifier:
    """`logits(batch)` of the ONNX model at `path`; `info` says how to make a batch from images."""

    def __init__(self, path: str | os.PathLike, threads: int = 0) -> None:
        onnx, ort = _import_runtime()
        self.path = str(path)
        data = _read_bounded(path)
        try:
            proto = onnx.load_model_from_string(data)
        except Exception as e:  # protobuf's DecodeError and friends: the file is not an ONNX model
            raise self._bad(f"is not an ONNX model ({type(e).__name__})") from None
        external = next(_external_tensors(proto.graph), None)
        if external is not None:
            raise self._bad(f"keeps tensor {external!r} in an external file, which is never read",
                            "export it again with `torchboost export` (one self-contained file)")
        self.info = DeployInfo.from_props({p.key: p.value for p in proto.metadata_props}, printable(self.path))
        del proto
        options = ort.SessionOptions()
        options.log_severity_level = 4  # fatal only: a load error is raised (and said once), not also logged
        options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's InvalidGraph, InvalidProtobuf, NotImplemented (unknown op)...
            raise self._bad(f"cannot be loaded by ONNX Runtime ({_first_line(e)})") from None
        self._check_signature()

    def _bad(self, what: str, fix: str = "pass an .onnx file written by `torchboost export`") -> CheckpointError:
        return CheckpointError(f"{printable(self.path)} {what}", fix)

    def _check_signature(self) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise self._bad(f"takes {len(inputs)} input(s) and gives {len(outputs)} output(s), not one of each")
        shape, want = inputs[0].shape, self.info.input_size
        if inputs[0].type != "tensor(float)" or len(shape) != 4 or list(shape[1:]) != list(want):
            raise self._bad(f"takes {inputs[0].type} of shape {shape} but its metadata says float N×"
                            f"{'×'.join(map(str, want))}")
        out = outputs[0].shape
        if len(out) != 2 or (isinstance(out[1], int) and out[1] != len(self.info.classes)):
            raise self._bad(f"gives outputs of shape {out} but its metadata names {len(self.info.classes)} classes")

    def logits(self, batch: np.ndarray) -> np.ndarray:
        """N×classes float32 logits of a float32 N×C×H×W batch (normalised as `info` says)."""
        name = self.session.get_inputs()[0].name
        try:
            (out,) = self.session.run(None, {name: np.ascontiguousarray(batch, dtype=np.float32)})
        except Exception as e:  # a graph that fails on its own declared input
            raise self._bad(f"failed in ONNX Runtime ({_first_line(e)})") from None
        if out.ndim != 2 or out.shape != (len(batch), len(self.info.classes)):
            raise self._bad(f"gave outputs of shape {tuple(out.shape)} for {len(batch)} image(s) and "
                            f"{len(self.info.classes)} classes")
        return out


def _import_runtime() -> tuple[Any, Any]:
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise ConfigError(f"running an .onnx model needs the onnx and onnxruntime packages "
                          f"({e.name or 'one'} is missing)", EXTRA) from None
    return onnx, onnxruntime


def _read_bounded(path: str | os.PathLike) -> bytes:
    if not Path(path).exists():
        raise CheckpointError(f"{printable(str(path))} not found", "check the path of the .onnx file")
    with open_regular(path, CheckpointError) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(MAX_BYTES + 1) if size <= MAX_BYTES else b""
    if size > MAX_BYTES or len(data) > MAX_BYTES:
        raise CheckpointError(f"{printable(str(path))} is larger than an ONNX model can be (2 GiB)",
                              "pass an .onnx file written by `torchboost export`")
    return data


def _external_tensors(graph: Any) -> Iterator[str]:
    """Names of tensors (initializers, constants, in subgraphs too) whose data lies in another file."""
    from onnx import TensorProto

    tensors = [*graph.initializer, *(s.values for s in graph.sparse_initializer)]
    for node in graph.node:
        for attr in node.attribute:
            tensors += [attr.t, *attr.tensors, attr.sparse_tensor.values, *(s.values for s in attr.sparse_tensors)]
            for sub in [attr.g, *attr.graphs]:
                yield from _external_tensors(sub)
    yield from (t.name for t in tensors if t.data_location == TensorProto.EXTERNAL or t.external_data)


def _first_line(e: BaseException) -> str:
    """ONNX Runtime's message without its source location and C++ signature prefix."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : (\w+) : (?:\S+:\d+ \S+\(.*?\) )?", r"\1: ", text)
    return printable(text[:300])
