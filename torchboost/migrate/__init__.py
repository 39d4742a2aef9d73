"""Migration from/to MindSpore: .ckpt read/write, ResNet weight-name maps, format conversion."""

from torchboost.migrate.convert import convert, load_torch_state, save_torch_state
from torchboost.migrate.mindspore_ckpt import (CkptContents, load_mindspore_ckpt, parse_mindspore_ckpt,
                                               read_mindspore_ckpt, save_mindspore_ckpt)
from torchboost.migrate.names import (MappingReport, detect_arch, layout, mindspore_notes, mindspore_to_torch,
                                      torch_to_mindspore)

__all__ = ["convert", "load_torch_state", "save_torch_state", "CkptContents", "load_mindspore_ckpt",
           "parse_mindspore_ckpt", "read_mindspore_ckpt", "save_mindspore_ckpt", "MappingReport", "detect_arch",
           "layout", "mindspore_notes", "mindspore_to_torch", "torch_to_mindspore"]
