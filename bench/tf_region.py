#!/usr/bin/env python3
"""Time TensorFlow running the region that Lode cuts out (stages 0..=I).

Run with the pinned TensorFlow (see fixtures/README.md):

    ~/.cache/lode/tf-2.18.1/bin/python bench/tf_region.py \
        --model-dir target/bench-data/deepfm --plan target/bench-data/deepfm/plan \
        --stage 2 --steps 500

Imports MODEL_DIR/model.pb into a tf.compat.v1 graph, chdirs to MODEL_DIR (the
graph's data paths are relative to it), opens a session with
ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
allow_soft_placement=True), runs the init ops (facts.json "init_ops", else
the graph's MakeIterator + table initializers), and then times K steps, each
one run call fetching every crossing tensor that stages 0..=I of the plan send
(the union of their send lists, in one call so the iterator advances exactly
once per step), after W untimed warmup steps. The fetch is built once with
Session.make_callable, so per-step Python overhead is as small as TF allows.

Prints one JSON line:
{"model", "stage", "steps", "samples", "seconds", "samples_per_sec", "engine": "tensorflow", ...}
where seconds is wall time (time.perf_counter); "cpu_seconds" (process CPU
time over the same steps, all threads) is added as a check on a loaded machine.
"""

import argparse
import json
import os
import sys
import time

BATCH = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_plan(plan_dir):
    path = os.path.join(plan_dir, "plan.json") if os.path.isdir(plan_dir) else plan_dir
    with open(path) as f:
        return json.load(f)


def crossing_tensors(plan, stage):
    stages = plan["stages"]
    if not 0 <= stage < len(stages):
        sys.exit(f"--stage {stage}: the plan has {len(stages)} stage(s) (0..={len(stages) - 1})")
    fetches, seen = [], set()
    for s in stages[: stage + 1]:
        for t in s["send"]["tensors"]:
            name = t["tensor"]
            if name not in seen:
                seen.add(name)
                fetches.append(name)
    return fetches


def init_op_names(model_dir, model, facts_path, graph_def):
    candidates = [facts_path] if facts_path else [
        os.path.join(model_dir, "facts.json"),
        os.path.join(REPO, "fixtures", model, "facts.json"),
    ]
    for path in candidates:
        if path and os.path.isfile(path):
            with open(path) as f:
                ops = json.load(f).get("init_ops")
            if ops:
                return ops, path
    # fallback: the iterator initializer(s) and the table initializers
    ops = [n.name for n in graph_def.node
           if n.op in ("MakeIterator", "InitializeTableFromTextFileV2", "LookupTableImportV2",
                       "InitializeTableV2", "InitializeTableFromTextFile", "InitializeTable")]
    return ops, "graph (MakeIterator + table initializers)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="directory holding model.pb and data/")
    ap.add_argument("--plan", required=True, help="plan directory written by `lode partition` (or its plan.json)")
    ap.add_argument("--stage", type=int, required=True, help="run stages 0..=I")
    ap.add_argument("--steps", type=int, required=True, help="timed steps K")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps before timing (default 20)")
    ap.add_argument("--model-file", default="model.pb", help="graph file inside --model-dir (default model.pb)")
    ap.add_argument("--model", help="model name for the output and facts lookup (default: basename of --model-dir)")
    ap.add_argument("--facts", help="facts.json to take init_ops from (default: MODEL_DIR/facts.json, then fixtures/<model>/facts.json)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    model_dir = os.path.abspath(args.model_dir)
    model = args.model or os.path.basename(model_dir.rstrip(os.sep))
    plan = load_plan(os.path.abspath(args.plan))
    fetches = crossing_tensors(plan, args.stage)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    graph_def = tf.compat.v1.GraphDef()
    with open(os.path.join(model_dir, args.model_file), "rb") as f:
        graph_def.ParseFromString(f.read())
    init_ops, init_src = init_op_names(model_dir, model, args.facts, graph_def)

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    missing = []
    for name in fetches:
        try:
            graph.get_tensor_by_name(name)
        except (KeyError, ValueError) as e:
            missing.append(f"{name}: {e}")
    if missing:
        sys.exit("crossing tensors not in the graph:\n  " + "\n  ".join(missing))

    os.chdir(model_dir)  # data paths in the graph are relative to the model dir
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1,
        inter_op_parallelism_threads=1,
        allow_soft_placement=True,
    )
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run([graph.get_operation_by_name(n) for n in init_ops])
        step = sess.make_callable(fetches)
        for _ in range(args.warmup):
            step()
        c0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - c0

    samples = args.steps * BATCH
    print(json.dumps({
        "model": model,
        "stage": args.stage,
        "steps": args.steps,
        "samples": samples,
        "seconds": seconds,
        "samples_per_sec": samples / seconds,
        "engine": "tensorflow",
        "threads": "1+1",
        "cpu_seconds": cpu_seconds,
        "warmup": args.warmup,
        "fetches": len(fetches),
        "init_ops": init_ops,
        "tf_version": tf.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
