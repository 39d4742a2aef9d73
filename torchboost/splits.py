"""The split names a data set may hold, defined once: a folder's (and shards') `train/`, `val/` and `test/`."""

TRAIN, VAL, TEST = "train", "val", "test"
EVAL_SPLITS = (VAL, TEST)  # a run's evaluation split: val when the data has it, else test
SPLITS = (TRAIN, *EVAL_SPLITS)
IN_MEMORY_SPLITS = (TRAIN, TEST)  # an in-memory set's (MNIST files, the built-in sets): no val
