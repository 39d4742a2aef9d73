"""An exported ONNX classifier run through ONNX Runtime, its preprocessing read from its own metadata.

The file is untrusted: an ONNX model is a program. A regular file only (a FIFO is refused, never waited on),
read whole up to ONNX's own 2 GiB limit, parsed and checked before ONNX Runtime sees it: every graph, subgraph,
function and tensor walked for external data (a path the file names), control flow and ops outside the image
classifier allow-list (`onnxcheck`); the metadata must be a torchboost export's (`DeployInfo.from_props`); the
graph must declare float32 N×C×H×W of the size the metadata says and one float32 logit per recorded class.
Then the checked bytes (never the path: no second read of a file that may have changed) are run in a child
process with a memory cap and a deadline that Ctrl-C or the end of the parent cuts short (`onnxproc`), and
each answer is checked (float32, batch × classes) before it is used.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np

from torchboost.deploy.metadata import DeployInfo
from torchboost.deploy.onnxcheck import FIX, check_graph, check_signature
from torchboost.deploy.onnxproc import ChildFailed, OrtProcess
from torchboost.errors import CheckpointError, ConfigError, printable
from torchboost.fileio import open_regular

MAX_BYTES = (1 << 31) - 1  # protobuf's limit on one message: a larger .onnx keeps its weights outside
EXTRA = "pip install 'torchboost[export]'"


class OnnxClassifier:
    """`logits(batch)` of the ONNX model at `path`; `info` says how to make a batch from images. The model
    runs in a child process (`onnxproc`): `load_seconds` bounds its start, `run_seconds` each batch (None:
    onnxproc's LOAD_SECONDS, RUN_SECONDS); `close()` ends it early."""

    def __init__(self, path: str | os.PathLike, threads: int = 0, *, load_seconds: Optional[float] = None,
                 run_seconds: Optional[float] = None) -> None:
        onnx = _import_runtime()
        self.path = str(path)
        source = printable(self.path)
        data = _read_bounded(path)
        try:
            proto = onnx.load_model_from_string(data)
        except Exception as e:  # protobuf's DecodeError and friends: the file is not an ONNX model
            raise self._bad(f"is not an ONNX model ({type(e).__name__})") from None
        check_graph(proto, source)
        twice = next((k for k, n in Counter(p.key for p in proto.metadata_props).items() if n > 1), None)
        if twice is not None:  # a dict keeps the last: a second `classes` would relabel every output
            raise self._bad(f"has the metadata key {printable(twice[:40])!r} twice")
        self.info = DeployInfo.from_props({p.key: p.value for p in proto.metadata_props}, source)
        input_name = check_signature(proto.graph, self.info.input_size, len(self.info.classes), source)
        del proto
        try:
            self._process = OrtProcess(data, input_name, threads, load_seconds=load_seconds,
                                       run_seconds=run_seconds)
        except ChildFailed as e:
            raise self._bad(str(e)) from None

    def _bad(self, what: str, fix: str = FIX) -> CheckpointError:
        return CheckpointError(f"{printable(self.path)} {what}", fix)

    def logits(self, batch: np.ndarray) -> np.ndarray:
        """N×classes float32 logits of a float32 N×C×H×W batch (normalised as `info` says)."""
        try:
            return self._process.run(batch, (len(batch), len(self.info.classes)))
        except ChildFailed as e:
            raise self._bad(str(e)) from None

    def close(self) -> None:
        """End ONNX Runtime's process (also done when this object is collected)."""
        self._process.close()


def _import_runtime() -> Any:
    """onnx, once onnxruntime is known to be installed (only the child process imports it: importing it
    writes under $HOME and $TMPDIR): ConfigError naming the extra otherwise."""
    try:
        import onnx
        if importlib.util.find_spec("onnxruntime") is None:
            raise ImportError(name="onnxruntime")
    except ImportError as e:
        raise ConfigError(f"running an .onnx model needs the onnx and onnxruntime packages "
                          f"({e.name or 'one'} is missing)", EXTRA) from None
    return onnx


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
