"""Other frameworks' names for torchboost's things, each framework in one module (`mindspore`)."""

__all__ = ["mindspore"]
