#!/usr/bin/env python3
"""Lode's data-worker stages compute what TensorFlow computes, step by step, judged by TensorFlow.

For each fixture with an input pipeline, both cuts (full and --simple), and every stage I:
  1. `lode partition` writes the plan directory.
  2. `lode exec PLAN --stage I --steps STEPS --dump DIR` runs stages 0..=I natively and writes
     stage I's send tensors of each step as binary TensorProtos (DIR/step_<s>/<k>.pb).
  3. TensorFlow runs the ORIGINAL graph (from the fixture directory, where its relative data
     paths resolve) after its init ops, fetching in one session.run per step every tensor that
     stages 0..=I send, so the iterator advances once per step.
  4. Every dumped tensor must equal TensorFlow's: dtype and shape exactly, integers, bools and
     strings exactly, floats bit for bit or within 1 ulp (the summary counts the 1-ulp ones).
The fixtures hold 256 records and batch 32 with repeat(), so STEPS = 12 crosses an epoch
boundary. The construct graphs of fixtures/constructs/ (one per feature-pipeline construct,
listed in its constructs.json; 12 records in batches of 4) are checked the same way, as
`constructs/<name>`. A self-check first shows the comparison catches a changed value.

Usage: python tests/conformance/exec_equivalence.py --lode target/debug/lode [--only NAME]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 12
MODELS = [
    ("wide_deep", "model.pb", None),
    ("deepfm", "model.pb", None),
    ("adam_resource", "model.pb", None),
    ("sgd_ref", "model.pb", None),
    # A one-shot iterator: its dataset is inlined from the iterator's factory function.
    ("one_shot", "model.pb", None),
    ("text_segments", "model.pb", None),
    ("tf1_savedmodel", "saved_model", "train"),
]


def construct_models(fixtures):
    """The construct graphs (fixtures/gen/constructs.py), as (dir under fixtures, form, tags)."""
    index = os.path.join(fixtures, "constructs", "constructs.json")
    with open(index) as f:
        names = [c["name"] for c in json.load(f)["constructs"]]
    return [(f"constructs/{name}", "model.pb", None) for name in names]


def session_config():
    return tf.compat.v1.ConfigProto(
        allow_soft_placement=True, intra_op_parallelism_threads=1, inter_op_parallelism_threads=1
    )


def load_graph_def(model_dir, form, tags):
    if tags is None:
        graph_def = tf.compat.v1.GraphDef()
        with open(os.path.join(model_dir, form), "rb") as f:
            graph_def.ParseFromString(f.read())
        return graph_def
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(model_dir, form, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    for meta in saved.meta_graphs:
        if list(meta.meta_info_def.tags) == tags.split(","):
            return meta.graph_def
    raise RuntimeError(f"no meta graph with tags {tags}")


def tf_steps(graph_def, init_ops, fetch_names, steps):
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        fetches = [graph.get_tensor_by_name(n) for n in fetch_names]
        with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
            for name in init_ops:
                sess.run(graph.get_operation_by_name(name))
            return [dict(zip(fetch_names, sess.run(fetches))) for _ in range(steps)]


def ulps(a, b):
    """Per-element distance in units in the last place (same-sign ordering of the bits)."""
    if a.dtype == np.float32:
        ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
        flip = 0x7FFFFFFF
    else:
        ia, ib = a.view(np.int64).astype(object), b.view(np.int64).astype(object)
        flip = 0x7FFFFFFFFFFFFFFF
    ia = np.where(ia < 0, -(ia & flip), ia)
    ib = np.where(ib < 0, -(ib & flip), ib)
    return np.abs(ia - ib)


def compare(expected, actual):
    """None when equal (floats within 1 ulp); else the first difference. Second value: how
    many float elements differ by exactly 1 ulp."""
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} != TensorFlow's {expected.dtype}", 0
    if expected.shape != actual.shape:
        return f"shape {actual.shape} != TensorFlow's {expected.shape}", 0
    if expected.dtype in (np.float32, np.float64):
        e, a = expected.ravel(), actual.ravel()
        both_nan = np.isnan(e) & np.isnan(a)
        d = ulps(e, a)
        d = np.where(both_nan, 0, d)
        bad = np.nonzero(d > 1)[0]
        if len(bad):
            i = bad[0]
            return f"element {i}: {a[i]!r} != TensorFlow's {e[i]!r} ({d[i]} ulp)", 0
        return None, int(np.count_nonzero(d == 1))
    e, a = expected.ravel(), actual.ravel()
    neq = np.nonzero(e != a)[0]
    if len(neq):
        i = neq[0]
        return f"element {i}: {a[i]!r} != TensorFlow's {e[i]!r}", 0
    return None, 0


def self_check():
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    y = x.copy()
    y[1] = np.nextafter(y[1], np.float32(10))
    assert compare(x, y) == (None, 1), "one ulp is tolerated and counted"
    y[1] = np.float32(2.5)
    assert compare(x, y)[0] is not None, "a changed float is caught"
    assert compare(np.array([1, 2]), np.array([1, 3]))[0] is not None, "a changed int is caught"
    assert compare(np.array([b"a"]), np.array([b"b"]))[0] is not None, "a changed string is caught"
    assert compare(np.zeros((2, 3)), np.zeros((3, 2)))[0] is not None, "a changed shape is caught"


def check(lode, fixtures, name, form, tags, simple, tmp):
    model_dir = os.path.join(fixtures, name)
    with open(os.path.join(model_dir, "facts.json")) as f:
        facts = json.load(f)
    label = f"{name} ({'simple' if simple else 'full'} cut)"
    plan_dir = os.path.join(tmp, f"{name.replace('/', '_')}{'-simple' if simple else ''}")
    cmd = [lode, "partition", os.path.join(model_dir, form), "-o", plan_dir, "--format", "json"]
    if tags:
        cmd += ["--tags", tags]
    if simple:
        cmd.append("--simple")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return [f"{label}: {' '.join(cmd)} failed: {done.stderr.strip()}"]
    with open(os.path.join(plan_dir, "plan.json")) as f:
        plan = json.load(f)
    stages = plan["stages"]
    if not stages:
        return [f"{label}: the plan has no data-worker stage"]
    fetch = sorted({t["tensor"] for s in stages for t in s["send"]["tensors"]})
    cwd = os.getcwd()
    os.chdir(model_dir)
    try:
        reference = tf_steps(load_graph_def(model_dir, form, tags), facts["init_ops"], fetch, STEPS)
    finally:
        os.chdir(cwd)
    failures = []
    for stage in stages:
        i = stage["index"]
        dump = os.path.join(tmp, f"dump-{name.replace('/', '_')}-{int(simple)}-{i}")
        cmd = [lode, "exec", plan_dir, "--stage", str(i), "--steps", str(STEPS), "--dump", dump, "--threads", "2"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            failures.append(f"{label} stage {i}: {' '.join(cmd)} failed: {done.stderr.strip()}")
            continue
        compared = one_ulp = 0
        stage_failures = []
        for step in range(STEPS):
            for k, entry in enumerate(stage["send"]["tensors"]):
                path = os.path.join(dump, f"step_{step}", f"{k}.pb")
                if not os.path.exists(path):
                    stage_failures.append(f"step {step}: {path} was not written")
                    continue
                proto = tf.make_tensor_proto(0)
                with open(path, "rb") as f:
                    proto.ParseFromString(f.read())
                actual = tf.make_ndarray(proto)
                expected = np.asarray(reference[step][entry["tensor"]])
                diff, n1 = compare(expected, actual)
                compared += 1
                one_ulp += n1
                if diff:
                    stage_failures.append(f"step {step}: {entry['tensor']} (send {k}): {diff}")
        if stage_failures:
            failures += [f"{label} stage {i}: {f}" for f in stage_failures[:10]]
            if len(stage_failures) > 10:
                failures.append(f"{label} stage {i}: … {len(stage_failures) - 10} more")
        else:
            exact = "bit for bit" if one_ulp == 0 else f"{one_ulp} float elements 1 ulp apart, the rest bit for bit"
            print(f"ok    {label} stage {i}: {compared} tensors over {STEPS} steps equal TensorFlow's ({exact})")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lode", required=True)
    parser.add_argument("--only", action="append", help="check only this fixture (repeatable)")
    parser.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "fixtures"))
    args = parser.parse_args()
    lode = os.path.abspath(args.lode)
    fixtures = os.path.abspath(args.fixtures)
    self_check()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, form, tags in MODELS + construct_models(fixtures):
            if args.only and name not in args.only and name.split("/")[-1] not in args.only:
                continue
            for simple in (False, True):
                try:
                    failures += check(lode, fixtures, name, form, tags, simple, tmp)
                except Exception as exc:  # report every model, not just the first broken one
                    failures.append(f"{name} ({'simple' if simple else 'full'}): {type(exc).__name__}: {exc}")
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for failure in failures:
            print(f"FAIL  {failure}", file=sys.stderr)
        return 1
    print("\nLode's stages reproduce TensorFlow's crossing tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
