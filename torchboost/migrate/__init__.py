"""Migration from/to MindSpore and PaddlePaddle: .ckpt and .pdparams read/write without either framework,
weight-name maps to torchvision/torchboost names, format conversion."""

from torchboost.migrate.convert import convert
from torchboost.migrate.formats import (FORMATS, WeightFormat, format_of, read_torch_named, read_weights,
                                        write_weights)
from torchboost.migrate.torch_files import load_torch_state
from torchboost.migrate.mindspore_ckpt import (CkptContents, load_mindspore_ckpt, parse_mindspore_ckpt,
                                               read_mindspore_ckpt, save_mindspore_ckpt)
from torchboost.migrate.names import (MappingReport, detect_arch, layout, mindspore_notes, mindspore_to_torch,
                                      torch_to_mindspore, zoo_model)
from torchboost.migrate.paddle_names import detect_paddle_arch, paddle_layout, paddle_to_torch, torch_to_paddle
from torchboost.migrate.pdparams import load_pdparams, parse_pdparams, save_pdparams
from torchboost.migrate.safe_pickle import safe_unpickle

__all__ = ["convert", "FORMATS", "WeightFormat", "format_of", "read_weights", "write_weights", "read_torch_named",
           "load_torch_state", "CkptContents",
           "load_mindspore_ckpt", "parse_mindspore_ckpt", "read_mindspore_ckpt", "save_mindspore_ckpt",
           "MappingReport", "detect_arch", "layout", "mindspore_notes", "mindspore_to_torch", "torch_to_mindspore",
           "zoo_model", "detect_paddle_arch", "paddle_layout", "paddle_to_torch", "torch_to_paddle",
           "load_pdparams", "parse_pdparams", "save_pdparams", "safe_unpickle"]
