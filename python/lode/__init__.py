"""Lode's training side.

`lode train -- python PROGRAM` loads this package into an unmodified TensorFlow program (see
`lode._hook`): the graph is cut when the program creates its session, and the session runs the
training graph, whose DWRecv nodes receive each step's tensors from Lode's data workers.

For a training graph run by hand (a plan's `training.pb`), `load_ops()` registers DWRecv, and
the job is named by the environment: LODE_DISPATCHER (the dispatcher's URL), LODE_TOKEN,
LODE_JOB (default 1), LODE_TLS_CA, LODE_PATIENCE_SECS.
"""

from lode._native import load_ops, native  # noqa: F401

__all__ = ["load_ops", "native"]
__version__ = "0.1.0"
