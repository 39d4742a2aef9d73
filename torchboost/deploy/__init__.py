"""Deployment: a trained classifier written as ONNX, TorchScript or an ExportedProgram with what a deployer
needs to feed it (`metadata`), and an exported ONNX model run back through ONNX Runtime (`onnxrun`): checked
first (`onnxcheck`), then run in a child process (`onnxproc`). onnx, onnxscript and onnxruntime (the `export`
extra) are imported only when a function needs them; the names below are imported on first use (`_EXPORTS`),
so that the child process, which imports `onnxproc` alone, never loads torch."""

from torchboost.lazy import lazy_exports

# public name -> the module it is imported from on first use
_EXPORTS = {**dict.fromkeys(("export_network", "export_program", "format_for", "onnx_bytes", "save_program",
                             "save_torchscript"), "torchboost.deploy.export"),
            "DeployInfo": "torchboost.deploy.metadata", "OnnxClassifier": "torchboost.deploy.onnxrun"}

__all__ = [*_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
