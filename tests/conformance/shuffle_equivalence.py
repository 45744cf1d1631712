#!/usr/bin/env python3
"""Programs that shuffle train on Lode's data order with TensorFlow's own losses.

For each fixture training program built with `shuffle=True`
(fixtures/shuffle/programs/<model>_shuffled.pb, over fixtures/<model>'s data):
  1. `lode partition --data-root fixtures/<model>` writes the plan; `lode exec --dump` writes
     the stage's send tensors for each step, in the order Lode's dispatcher leases (TensorFlow's
     shuffle reproduced on record indices, a new order each epoch).
  2. TensorFlow runs the ORIGINAL program, its own shuffled tf.data pipeline included.
  3. TensorFlow runs training.pb with each DWRecv stood in for by placeholders, fed with
     Lode's dumped tensors (nothing captured from TensorFlow's run).
  4. The losses must be equal bit for bit, step by step, across the epoch boundary (8 steps an
     epoch; 12 steps).

Usage: python tests/conformance/shuffle_equivalence.py --lode target/debug/lode
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The same TensorFlow set-up, session config and DWRecv stand-in as the loss-equivalence check.
from partition_equivalence import np, read_graph, session_config, stand_in_for_dwrecv, tf  # noqa: E402

STEPS = 12
MODELS = ["sgd_ref", "adam_resource"]


def lode_run(lode, *args):
    done = subprocess.run([lode, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"lode {args[0]} failed ({done.returncode}): {done.stderr.strip()}")


def original_losses(graph_path, model_dir):
    cwd = os.getcwd()
    os.chdir(model_dir)
    try:
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(read_graph(graph_path), name="")
            loss = graph.get_tensor_by_name("loss:0")
            train_op = graph.get_operation_by_name("train_op")
            with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
                sess.run(graph.get_operation_by_name("init"))
                sess.run(graph.get_operation_by_name("MakeIterator"))
                return [sess.run([train_op, loss])[1] for _ in range(STEPS)]
    finally:
        os.chdir(cwd)


def lode_losses(plan_dir, plan, dump):
    """training.pb fed with the tensors `lode exec` dumped, step by step."""
    sent = {}
    for stage in plan["stages"]:
        for k, t in enumerate(stage["send"]["tensors"]):
            sent[t["tensor"]] = (stage["index"], k)
    graph_def, slots = stand_in_for_dwrecv(read_graph(os.path.join(plan_dir, "training.pb")))
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        loss = graph.get_tensor_by_name("loss:0")
        train_op = graph.get_operation_by_name("train_op")
        with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
            sess.run(graph.get_operation_by_name("init"))
            losses = []
            for step in range(STEPS):
                feed = {}
                for entry in plan["training"]["recv"]:
                    for i, tensor in enumerate(entry["tensors"]):
                        _, k = sent[tensor]
                        proto = tf.compat.v1.make_tensor_proto(0)
                        with open(os.path.join(dump, f"step_{step}", f"{k}.pb"), "rb") as f:
                            proto.ParseFromString(f.read())
                        ph = graph.get_tensor_by_name(slots[entry["node"]][i] + ":0")
                        feed[ph] = tf.make_ndarray(proto)
                losses.append(sess.run([train_op, loss], feed_dict=feed)[1])
            return losses


def check(lode, fixtures, model, tmp):
    graph_path = os.path.join(fixtures, "shuffle", "programs", f"{model}_shuffled.pb")
    model_dir = os.path.join(fixtures, model)
    plan_dir = os.path.join(tmp, model)
    dump = os.path.join(tmp, f"{model}-dump")
    lode_run(lode, "partition", graph_path, "--data-root", model_dir, "-o", plan_dir)
    with open(os.path.join(plan_dir, "plan.json")) as f:
        plan = json.load(f)
    if len(plan["stages"]) != 1:
        raise RuntimeError(f"expected one stage, the plan has {len(plan['stages'])}")
    lode_run(lode, "exec", plan_dir, "--steps", str(STEPS), "--dump", dump)
    original = original_losses(graph_path, model_dir)
    on_lode = lode_losses(plan_dir, plan, dump)
    failures = []
    for step, (a, b) in enumerate(zip(original, on_lode)):
        if np.float32(a).tobytes() != np.float32(b).tobytes():
            failures.append(f"{model}: step {step}: loss {a!r} (TensorFlow's pipeline) != {b!r} (Lode's order)")
    if len(on_lode) != STEPS:
        failures.append(f"{model}: {len(on_lode)} steps, expected {STEPS}")
    if not failures:
        print(f"ok    {model} (shuffle(256) seeded, reshuffled each epoch): {STEPS} losses equal bit for bit")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lode", required=True)
    parser.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "fixtures"))
    args = parser.parse_args()
    lode = os.path.abspath(args.lode)
    fixtures = os.path.abspath(args.fixtures)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            try:
                failures += check(lode, fixtures, model, tmp)
            except Exception as exc:  # report every model, not just the first broken one
                failures.append(f"{model}: {type(exc).__name__}: {exc}")
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for failure in failures:
            print(f"FAIL  {failure}", file=sys.stderr)
        return 1
    print("\nshuffled programs train on Lode's order with TensorFlow's losses, bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
