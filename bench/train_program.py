"""The training program of the train benchmark (bench/train_bench.py): a fixture program's
graph trained for --steps steps, timing itself over the steady window.

    python bench/train_program.py --model wide_deep --data DIR --steps 3000 --warmup 500
    python bench/train_program.py --model deepfm --data DIR --service grpc://127.0.0.1:PORT
    python bench/train_program.py --model wide_deep --data DIR --cached

The graph is the fixture's (`fixtures/programs/wide_deep_session.py`: a plain Session, an
initializable iterator, the `OutOfRangeError` loop; `fixtures/programs/deepfm_monitored.py`:
`MonitoredTrainingSession`, a one-shot iterator), the session runs with one intra-op and one
inter-op thread, and every step fetches the train op and the loss (the loss bits go to
--losses). Run plainly, or under `lode train`, it is the unchanged program; `--service` is the
copy of it a tf.data service user writes (the parsed dataset `distribute`d to the service,
`parallel_epochs`); `--cached` is the input nearly free (the first parsed batch, computed once, yielded as
constants for every step).

The last line of stdout is one JSON object: steps, the steady window's steps (after --warmup),
its samples per second, the process's own CPU (`time.process_time`: every thread of this
process, TensorFlow's, tf.data's and Lode's receiver's) per sample over that window, and
Python's garbage collections per generation over it (with the objects the collector tracks).
"""

import argparse
import gc
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "programs"))

import tensorflow as tf  # noqa: E402

BATCH = 32


def finisher(args):
    if args.service:
        return lambda ds: ds.apply(tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs", service=args.service))
    if args.cached:
        return cached
    return None


def cached(dataset):
    """The input nearly free: the dataset's first element, computed once, then yielded as
    constants for every step. (`take(1).cache().repeat()` restarts a pass of the cache for
    every element, which costs more than the parsing it saves.)"""
    first = tf.compat.v1.data.make_one_shot_iterator(dataset.take(1)).get_next()
    with tf.compat.v1.Session(config=session_config()) as sess:
        value = sess.run(first)

    def constants(v):
        if isinstance(v, tf.compat.v1.SparseTensorValue):
            return tf.SparseTensor(tf.constant(v.indices), tf.constant(v.values), tf.constant(v.dense_shape))
        if isinstance(v, dict):
            return {k: constants(x) for k, x in v.items()}
        if isinstance(v, (tuple, list)):
            return type(v)(constants(x) for x in v)
        return tf.constant(v)

    return tf.data.Dataset.range(1 << 62).map(lambda _: constants(value))


def session_config():
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)


class Clock:
    """Step count, and the wall and CPU clocks read when the steady window starts and ends."""

    def __init__(self, warmup, out, steady_file=None):
        self.warmup, self.out, self.steps, self.steady_file = warmup, out, 0, steady_file
        self.start = self.end = None

    def step(self, value):
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        self.out.write(f"{self.steps} {bits:08x} {float(value)!r}\n")
        self.steps += 1
        if self.steps == self.warmup:
            self.start = (time.perf_counter(), time.process_time())
            self.gc_start = [g["collections"] for g in gc.get_stats()]
            if self.steady_file:
                with open(self.steady_file + ".tmp", "w") as f:
                    f.write(f"{os.getpid()}\n")
                os.replace(self.steady_file + ".tmp", self.steady_file)

    def stop(self):
        self.end = (time.perf_counter(), time.process_time())
        self.gc_end = [g["collections"] for g in gc.get_stats()]

    def report(self, args):
        if self.start is None:
            sys.exit(f"train_program: {self.steps} steps, not more than --warmup {self.warmup}")
        steady = self.steps - self.warmup
        wall, cpu = (e - s for e, s in zip(self.end, self.start))
        return {"model": args.model, "steps": self.steps, "steady_steps": steady,
                "samples_per_s": steady * BATCH / wall,
                "cpu_us_per_sample": cpu * 1e6 / (steady * BATCH),
                "cpu_share": cpu / wall,
                # Python's collections of each generation over the window, per 1,000 steps.
                "gc_per_1000_steps": [round((e - s) * 1000 / steady, 2)
                                      for e, s in zip(self.gc_end, self.gc_start)],
                "gc_objects": len(gc.get_objects())}


def wide_deep(args, clock):
    import wide_deep_session

    init, iterator, train_op, loss = wide_deep_session.build(args.data, finish=finisher(args))
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(init)
        sess.run(iterator.initializer)
        while clock.steps < args.steps:
            try:
                _, value = sess.run([train_op, loss])
            except tf.errors.OutOfRangeError:
                break
            clock.step(value)
        clock.stop()


def deepfm(args, clock):
    import deepfm_monitored

    train_op, loss, _ = deepfm_monitored.build(args.data, finish=finisher(args))
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
    with tf.compat.v1.train.MonitoredTrainingSession(
        config=session_config(),
        save_checkpoint_steps=None,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        hooks=hooks,
    ) as sess:
        while not sess.should_stop():
            _, value = sess.run([train_op, loss])
            clock.step(value)
        clock.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=["wide_deep", "deepfm"])
    p.add_argument("--data", required=True, help="the model's data directory")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=500, help="steps before the steady window")
    p.add_argument("--losses", default=os.devnull)
    p.add_argument("--steady-file", help="written with this process's id when the window starts")
    variant = p.add_mutually_exclusive_group()
    variant.add_argument("--service", help="tf.data service dispatcher (grpc://HOST:PORT)")
    variant.add_argument("--cached", action="store_true", help="one parsed batch, repeated")
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error("--warmup must be positive and less than --steps")
    tf.compat.v1.disable_eager_execution()
    with open(args.losses, "w") as out:
        clock = Clock(args.warmup, out, args.steady_file)
        (wide_deep if args.model == "wide_deep" else deepfm)(args, clock)
    print(json.dumps(clock.report(args)), flush=True)


if __name__ == "__main__":
    main()
