"""DWRecv's own cost per step in the training process: the wide & deep fixture program's graph
(fixtures/programs/wide_deep_session.py) run for --steps steps with TensorFlow's full trace, under
`lode train` (so its session runs the training graph). Reports the DWRecv node's time per step
(median and p90 of its op time in the step stats; the data is already buffered, so this is
the receive and the copy into TensorFlow's tensors, not waiting: compare `waiting` below) and
the bytes it hands TensorFlow per step.

    lode train --workers 1 -- python bench/dwrecv_cost.py --data fixtures/wide_deep/data
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "programs"))

import tensorflow as tf  # noqa: E402
import wide_deep_session  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    init, iterator, train_op, loss = wide_deep_session.build(args.data)
    iterator_ds = iterator  # re-initialized each pass of 8 steps
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    micros, nbytes = [], []
    with tf.compat.v1.Session() as sess:
        sess.run(init)
        sess.run(iterator_ds.initializer)
        done = 0
        while done < args.steps:
            meta = tf.compat.v1.RunMetadata()
            try:
                sess.run(train_op, options=options, run_metadata=meta)
            except tf.errors.OutOfRangeError:
                sess.run(iterator_ds.initializer)
                continue
            done += 1
            time.sleep(0.005)  # let the workers refill the buffer: measure the op, not waiting
            for dev in meta.step_stats.dev_stats:
                for node in dev.node_stats:
                    if node.node_name.startswith("lode/DWRecv"):
                        micros.append(node.all_end_rel_micros)
                        nbytes.append(sum(o.tensor_description.allocation_description.requested_bytes
                                          for o in node.output))
    if not micros:
        sys.exit("no DWRecv node ran: is the program running under `lode train`?")
    micros = micros[20:]
    nbytes = nbytes[20:]
    q = statistics.quantiles(micros, n=10)
    print(f"DWRecv: {len(micros)} steps, median {statistics.median(micros):.0f} us, p90 {q[-1]:.0f} us, "
          f"{statistics.median(nbytes):.0f} bytes per step")


if __name__ == "__main__":
    main()
