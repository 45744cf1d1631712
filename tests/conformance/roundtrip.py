#!/usr/bin/env python3
"""Lode's graph I/O judged by TensorFlow's own protobuf parser.

For every form of every fixture (facts.json lists them), Lode converts the model's GraphDef
  binary/text/meta/SavedModel --lode--> text --lode--> binary    and    --lode--> binary
and TensorFlow (the pinned tensorflow-cpu, its generated *_pb2 classes) must find each result
equal to the GraphDef it reads from the original file itself; TensorFlow must also parse Lode's
text output to the same message. A graph carrying fields this TensorFlow does not know (injected
unknown fields at the top level and inside a node) must come back with them intact.

Usage: python tests/conformance/roundtrip.py --lode target/debug/lode [--fixtures fixtures]
Exit status 0 when everything agrees, 1 with a list of differences otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from google.protobuf import text_format  # noqa: E402
from google.protobuf.unknown_fields import UnknownFieldSet  # noqa: E402
from tensorflow.core.framework import graph_pb2, node_def_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2  # noqa: E402


def tf_graph(path, tags):
    """The GraphDef TensorFlow reads from `path` (selecting the MetaGraph by `tags`)."""
    if os.path.isdir(path):
        binary = os.path.join(path, "saved_model.pb")
        saved = saved_model_pb2.SavedModel()
        if os.path.exists(binary):
            with open(binary, "rb") as f:
                saved.ParseFromString(f.read())
        else:
            with open(os.path.join(path, "saved_model.pbtxt")) as f:
                text_format.Parse(f.read(), saved)
        for meta in saved.meta_graphs:
            if tags is None or sorted(meta.meta_info_def.tags) == sorted(tags):
                return meta.graph_def
        raise SystemExit(f"{path}: no MetaGraph with tags {tags}")
    if path.endswith(".meta"):
        meta = meta_graph_pb2.MetaGraphDef()
        with open(path, "rb") as f:
            meta.ParseFromString(f.read())
        return meta.graph_def
    graph = graph_pb2.GraphDef()
    if path.endswith(".pbtxt"):
        with open(path) as f:
            text_format.Parse(f.read(), graph)
    else:
        with open(path, "rb") as f:
            graph.ParseFromString(f.read())
    return graph


def lode_convert(lode, src, to, out, tags):
    cmd = [lode, "convert", src, "--to", to, "-o", out]
    if tags:
        cmd += ["--tags", ",".join(tags)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


def read_graph(path):
    graph = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        graph.ParseFromString(f.read())
    return graph


def same(a, b):
    """Equal as messages and in TensorFlow's deterministic encoding (which sorts map entries and
    keeps unknown fields), so neither map order nor NaN payloads can hide a difference."""
    return a == b and a.SerializeToString(deterministic=True) == b.SerializeToString(
        deterministic=True
    )


def first_difference(a, b):
    for i, (na, nb) in enumerate(zip(a.node, b.node)):
        if na != nb:
            return f"node #{i} '{na.name}' differs"
    if len(a.node) != len(b.node):
        return f"node count {len(a.node)} vs {len(b.node)}"
    for field in ("library", "versions", "debug_info"):
        if getattr(a, field) != getattr(b, field):
            return f"{field} differs"
    return "unknown fields or encoding differ"


def forms(fixtures):
    for name in sorted(os.listdir(fixtures)):
        facts_path = os.path.join(fixtures, name, "facts.json")
        if not os.path.exists(facts_path):
            continue
        with open(facts_path) as f:
            facts = json.load(f)
        tag_sets = [m["tags"] for m in facts.get("meta_graphs", [])] or [facts.get("tags")]
        for form in facts["forms"].values():
            for tags in tag_sets:
                yield name, os.path.join(fixtures, name, form), tags


def check_form(lode, tmp, name, path, tags):
    """Returns a list of failures for one (fixture, form, tags)."""
    failures = []
    label = f"{name}:{os.path.relpath(path)}" + (f" tags={','.join(tags)}" if tags else "")
    original = tf_graph(path, tags)
    text_out = os.path.join(tmp, "a.pbtxt")
    back_out = os.path.join(tmp, "b.pb")
    direct_out = os.path.join(tmp, "c.pb")
    lode_convert(lode, path, "pbtxt", text_out, tags)
    lode_convert(lode, text_out, "pb", back_out, None)
    lode_convert(lode, path, "pb", direct_out, tags)

    results = {
        "binary -> text -> binary": read_graph(back_out),
        "binary -> binary": read_graph(direct_out),
    }
    tf_reads_lode_text = graph_pb2.GraphDef()
    with open(text_out) as f:
        text_format.Parse(f.read(), tf_reads_lode_text)
    results["TensorFlow parsing Lode's text"] = tf_reads_lode_text
    for what, graph in results.items():
        if same(original, graph):
            print(f"ok    {label}: {what} ({len(graph.node)} nodes, "
                  f"{len(graph.library.function)} functions)")
        else:
            failures.append(f"{label}: {what}: {first_difference(original, graph)}")
    return failures


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number, wire_type, payload):
    return varint((number << 3) | wire_type) + payload


def check_unknown_fields(lode, tmp, fixtures):
    """Fields a later TensorFlow might add must survive Lode's binary -> text -> binary."""
    with open(os.path.join(fixtures, "sgd_ref", "model.pb"), "rb") as f:
        base = f.read()
    node = node_def_pb2.NodeDef(name="from_the_future", op="NoOp")
    node_bytes = node.SerializeToString() + field_bytes(1000, 2, varint(6) + b"future")
    injected = (
        base
        + field_bytes(1, 2, varint(len(node_bytes)) + node_bytes)  # one more node, with an unknown field
        + field_bytes(1001, 0, varint(424242))  # an unknown top-level varint
        + field_bytes(1002, 5, b"\x01\x02\x03\x04")  # an unknown top-level fixed32
    )
    src = os.path.join(tmp, "future.pb")
    with open(src, "wb") as f:
        f.write(injected)
    original = graph_pb2.GraphDef()
    original.ParseFromString(injected)
    text_out = os.path.join(tmp, "future.pbtxt")
    back_out = os.path.join(tmp, "future.back.pb")
    lode_convert(lode, src, "pbtxt", text_out, None)
    lode_convert(lode, text_out, "pb", back_out, None)
    back = read_graph(back_out)
    failures = []
    top = {f.field_number for f in UnknownFieldSet(back)}
    in_node = {f.field_number for f in UnknownFieldSet(back.node[-1])}
    if not {1001, 1002} <= top:
        failures.append(f"unknown top-level fields lost: kept {sorted(top)}")
    if 1000 not in in_node:
        failures.append(f"unknown NodeDef field lost: kept {sorted(in_node)}")
    if not same(original, back):
        failures.append("graph with unknown fields: " + first_difference(original, back))
    if not failures:
        print("ok    unknown fields (top level and in a NodeDef) survive binary -> text -> binary")
    return failures


def self_check(fixtures):
    """The comparison must see the smallest changes, or every "ok" above means nothing."""
    graph = tf_graph(os.path.join(fixtures, "sgd_ref", "model.pb"), None)
    variants = []
    dropped = graph_pb2.GraphDef()
    dropped.CopyFrom(graph)
    del dropped.node[-1]
    variants.append(("a dropped node", dropped))
    renamed = graph_pb2.GraphDef()
    renamed.CopyFrom(graph)
    renamed.node[0].device = "/device:GPU:0"
    variants.append(("a changed device", renamed))
    unknown = graph_pb2.GraphDef()
    unknown.ParseFromString(graph.SerializeToString() + field_bytes(1001, 0, varint(1)))
    variants.append(("an extra unknown field", unknown))
    for what, variant in variants:
        if same(graph, variant):
            raise SystemExit(f"self-check failed: the comparison misses {what}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lode", required=True, help="path to the lode binary")
    parser.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "fixtures"))
    args = parser.parse_args()
    lode = os.path.abspath(args.lode)
    fixtures = os.path.abspath(args.fixtures)
    self_check(fixtures)
    failures = []
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, tags in forms(fixtures):
            try:
                failures += check_form(lode, tmp, name, path, tags)
            except Exception as exc:  # report every form, not just the first broken one
                failures.append(f"{name}:{path}: {exc}")
            checked += 1
        failures += check_unknown_fields(lode, tmp, fixtures)
    if checked < 15:
        failures.append(f"only {checked} fixture forms found under {fixtures}")
    if failures:
        print(f"\n{len(failures)} round-trip failure(s):", file=sys.stderr)
        for failure in failures:
            print(f"FAIL  {failure}", file=sys.stderr)
        return 1
    print(f"\nall {checked} fixture forms round-trip through Lode as TensorFlow reads them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
