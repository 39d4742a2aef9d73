"""The `pipe:` prefix of a shard source: the rest of the name is a shell command whose output is read as a
tar (webdataset's convention; run by `data.shardfiles.open_shard`). It has its own module so that
`recipe.saved` can refuse a saved config that names one without importing the shard readers."""

PIPE = "pipe:"
