"""Deployment: a trained classifier written as ONNX, TorchScript or an ExportedProgram with what a deployer
needs to feed it (`metadata`), and an exported ONNX model run back through ONNX Runtime (`onnxrun`).
onnx, onnxscript and onnxruntime (the `export` extra) are imported only when a function needs them."""

from torchboost.deploy.export import (export_network, export_program, format_for, onnx_bytes, save_program,
                                      save_torchscript)
from torchboost.deploy.metadata import DeployInfo
from torchboost.deploy.onnxrun import OnnxClassifier

__all__ = ["DeployInfo", "OnnxClassifier", "export_network", "export_program", "format_for", "onnx_bytes",
           "save_program", "save_torchscript"]
