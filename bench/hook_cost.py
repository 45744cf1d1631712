"""The session hook's own Python per `session.run`: what `lode_run` does around TensorFlow's run
(`_extend`'s look for ops added to the program's graph, the translation of the fetches into the
training graph's elements), timed on the wide & deep fixture program's graph with the fetches
its loop passes, `[train_op, loss]`. No job is needed: the training graph here is a copy of
the program's (the same names), which is all the translation reads.

    python bench/hook_cost.py [--data fixtures/wide_deep/data] [--runs 20000]

Prints microseconds per run, median of 5 repeats. Run it with the package whose hook is to be
measured first on PYTHONPATH (`pip install --target DIR ./python`).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "programs"))

import tensorflow as tf  # noqa: E402

from lode import _hook  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--data", default=os.path.join(here, "..", "fixtures", "wide_deep", "data"))
    p.add_argument("--runs", type=int, default=20000)
    args = p.parse_args()
    tf.compat.v1.disable_eager_execution()
    import wide_deep_session

    source = tf.Graph()
    with source.as_default():
        _, _, train_op, loss = wide_deep_session.build(args.data)
    target = tf.Graph()
    with target.as_default():
        tf.graph_util.import_graph_def(source.as_graph_def(), name="")
    _hook._state["known"] = len(source.get_operations())
    translator = _hook._Translator(source, target)
    fetches = [train_op, loss]

    def per_run():
        started = time.perf_counter()
        for _ in range(args.runs):
            _hook._extend(source, target)
            translator(fetches)
        return (time.perf_counter() - started) * 1e6 / args.runs

    samples = [per_run() for _ in range(5)]
    print(f"hook Python per run ({len(source.get_operations())} ops in the graph): "
          f"median {statistics.median(samples):.2f} us, range {min(samples):.2f}-{max(samples):.2f} us")


if __name__ == "__main__":
    main()
