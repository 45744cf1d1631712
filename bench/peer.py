#!/usr/bin/env python3
"""The peer benchmark's Python side: tf.data service processes, the samplers, the table.

bench/peer.sh drives it (see bench/README.md, "Peer benchmark"); every subcommand is one
small job:

    prepare      MODEL_DIR: model_peer.pb (model.pb with device pins cleared) and
                 data/shards/ (the training file split into whole-batch files)
    check        the tf.data pipeline's first two elements equal `lode exec --dump`'s tensors
    tf-dispatcher, tf-worker
                 a tf.data service DispatchServer / WorkerServer in this process
    tf-consume   run configurations against a running tf.data service, one after another,
                 measuring each (samples/s, CPU of every process over the window)
    lode-sample  measure a running Lode job from its consumer's log
    exec-cpu     `lode exec --threads 1`: samples per CPU-second
    worker-eff   one worker's samples per CPU-second against `lode exec --threads 1`'s, in
                 alternating windows on one running job (the job stopped while exec runs)
    exec-transport
                 `lode exec --transport none|encode|loopback` in alternating runs: a stage's
                 CPU with its frame's encoding and send, without the rest of a worker
    consumer-cost
                 the receiver's side of one running job: `lode consume`'s CPU, context
                 switches and system calls a step
    table        results.jsonl -> the markdown tables (medians over rounds)

The tf.data pipeline is the fixture's own (fixtures/gen/generate.py: the reader, batch(32,
drop_remainder=True), the parse map, repeat), followed for Lode's cuts by a map that runs
exactly the region of the fixture's graph that the Lode plan's data-worker stages compute:
the subgraph from IteratorGetNext's outputs to every tensor the plan's stages send, imported
from the same model_peer.pb. For the `--simple` cut that region is only DeserializeSparse
(the parse map's sparse outputs as indices/values/shape); for the full cut it is the feature
columns and the index preprocessing of the gradients Lode moves.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

BATCH = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
TABLE_OPS = ("HashTableV2", "HashTable")
TABLE_INIT_OPS = ("InitializeTableV2", "LookupTableImportV2", "InitializeTableFromTextFileV2")
SHARDS = 16

# model -> training file under the model dir, its kind (as bench/make_data.py)
MODELS = {"wide_deep": ("data/train.tfrecord", "tfrecord"), "deepfm": ("data/train.csv", "text")}


def die(msg):
    print(f"peer.py: {msg}", file=sys.stderr)
    sys.exit(2)


# --------------------------------------------------------------------------- /proc


def cpu_ticks(pid):
    """utime + stime of every thread of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        raise ProcessLookupError(f"process {pid} has exited")
    return int(fields[11]) + int(fields[12])


def per_thread_sum(pid, name, value):
    """`value(text)` of /proc/PID/task/TID/NAME, summed over the process's threads."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                total += value(f.read())
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def run_queue_wait_ns(pid):
    """Nanoseconds every thread of a process has waited on a run queue (runnable, while
    another task had its CPU): the second field of /proc/PID/task/TID/schedstat, summed."""
    return per_thread_sum(pid, "schedstat", lambda text: int(text.split()[1]))


def context_switches(pid):
    """Voluntary and involuntary context switches of every thread of a process, summed
    (/proc/PID/task/TID/status)."""
    return per_thread_sum(pid, "status", lambda text: sum(
        int(line.split()[1]) for line in text.splitlines()
        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))))


def worker_counters(url):
    """A worker's counters (name -> value) from its metrics endpoint."""
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def on_cpus(cpus):
    """A `preexec_fn` that keeps the child and every thread it starts on `cpus` (None: no
    restriction)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def spawn_logged(procs, work, name, cmd, stdout=subprocess.DEVNULL, cpus=None):
    """Starts `cmd` with its stderr in `work/NAME.err` and adds (name, process) to `procs`;
    on `cpus` when given."""
    err = open(os.path.join(work, f"{name}.err"), "wb")
    procs.append((name, subprocess.Popen(cmd, stdout=stdout, stderr=err,
                                         preexec_fn=on_cpus(cpus))))
    return procs[-1][1]


# `--pin`: the worker (and `lode exec`, in its turn) on the first CPU, the dispatcher and the
# consumer on the second.
PIN_WORKER, PIN_REST = {0}, {1}


def check_pin(args, what):
    """Dies unless this process may run on the two CPUs `--pin` uses."""
    if getattr(args, "pin", False) and not {0, 1} <= os.sched_getaffinity(0):
        die(f"{what} --pin: needs CPUs 0 and 1 (this process may run on "
            f"{sorted(os.sched_getaffinity(0))})")


def stop_all(procs, work):
    """Kills what `spawn_logged` started and still runs, and removes `work`."""
    import shutil
    for _, p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(work, ignore_errors=True)


def parse_pids(text):
    """'dispatcher=12,worker1=13' -> [('dispatcher', 12), ('worker1', 13)]"""
    out = []
    for item in filter(None, (text or "").split(",")):
        name, _, pid = item.partition("=")
        if not pid.isdigit():
            die(f"--pids: '{item}' is not NAME=PID")
        out.append((name, int(pid)))
    return out


def snapshot(pids, steps):
    return {"t": time.monotonic(), "steps": steps, "cpu": {n: cpu_ticks(p) for n, p in pids}}


def result(label, a, b, batch, extra):
    seconds = b["t"] - a["t"]
    samples = (b["steps"] - a["steps"]) * batch
    row = dict(extra, config=label, seconds=round(seconds, 3), samples=samples,
               samples_per_sec=samples / seconds if seconds > 0 else 0.0, cpu_us_per_sample={})
    for name in a["cpu"]:
        cpu_s = (b["cpu"][name] - a["cpu"][name]) / TICK
        row["cpu_us_per_sample"][name] = cpu_s * 1e6 / samples if samples else None
    return row


def plural(n):
    return f"{n} worker" if n == 1 else f"{n} workers"


def append_json(path, row):
    """Appends `row` to the JSON-lines file `path`."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def emit(path, row):
    if not row.get("samples_per_sec"):
        die(f"{row.get('model')}: {row.get('config')}: no samples delivered")
    print(json.dumps(row), flush=True)
    append_json(path, row)


# --------------------------------------------------------------------------- data


def split_file(path, kind):
    with open(path, "rb") as f:
        blob = f.read()
    if kind == "text":
        return blob.splitlines(keepends=True)
    frames, pos = [], 0
    while pos < len(blob):
        (length,) = struct.unpack_from("<Q", blob, pos)
        frames.append(blob[pos:pos + 12 + length + 4])
        pos += 12 + length + 4
    return frames


def cmd_prepare(args):
    import tensorflow as tf  # noqa: F401  (GraphDef only)

    model = os.path.basename(os.path.normpath(args.model_dir))
    if model not in MODELS:
        die(f"{args.model_dir}: not one of {sorted(MODELS)}")
    gd = read_graph(os.path.join(args.model_dir, "model.pb"))
    for node in gd.node:
        node.device = ""
    with open(os.path.join(args.model_dir, "model_peer.pb"), "wb") as f:
        f.write(gd.SerializeToString())
    rel, kind = MODELS[model]
    records = split_file(os.path.join(args.model_dir, rel), kind)
    batches = len(records) // BATCH
    if batches < SHARDS:
        die(f"{rel}: {len(records)} records are fewer than {SHARDS} batches of {BATCH}")
    shard_dir = os.path.join(args.model_dir, "data", "shards")
    os.makedirs(shard_dir, exist_ok=True)
    for i in range(SHARDS):
        lo, hi = i * batches // SHARDS * BATCH, (i + 1) * batches // SHARDS * BATCH
        with open(os.path.join(shard_dir, f"{i:02d}{os.path.splitext(rel)[1]}"), "wb") as f:
            f.writelines(records[lo:hi])
    print(f"{model}: model_peer.pb, {SHARDS} shards of {len(records)} records")


def shard_files(model_dir, model):
    ext = os.path.splitext(MODELS[model][0])[1]
    return [os.path.join(model_dir, "data", "shards", f"{i:02d}{ext}") for i in range(SHARDS)]


# --------------------------------------------------------------------------- the tf.data pipeline


def read_graph(path):
    import tensorflow as tf

    gd = tf.compat.v1.GraphDef()
    with open(path, "rb") as f:
        gd.ParseFromString(f.read())
    return gd


def fixture_source(model, files):
    """The fixture's own input pipeline (fixtures/gen/generate.py, build_wide_deep and
    build_deepfm) up to its parse map, over `files`."""
    import tensorflow as tf

    sys.path.insert(0, os.path.join(REPO, "fixtures", "gen"))
    import generate as g  # constants only; generate.py imports TensorFlow lazily

    if model == "wide_deep":
        fc = tf.compat.v1.feature_column
        age = fc.numeric_column("age", normalizer_fn=lambda x: (x - 40.0) / 15.0)
        hours = fc.numeric_column("hours", normalizer_fn=lambda x: (x - 40.0) / 15.0)
        education = fc.categorical_column_with_vocabulary_list("education", g.EDUCATION)
        occupation = fc.categorical_column_with_hash_bucket("occupation", hash_bucket_size=50)
        country = fc.categorical_column_with_vocabulary_file(
            "country", "data/country_vocab.txt", vocabulary_size=len(g.COUNTRIES),
            num_oov_buckets=1)
        age_buckets = fc.bucketized_column(
            fc.numeric_column("age"), boundaries=[25.0, 35.0, 45.0, 55.0, 65.0])
        crossed = fc.crossed_column([age_buckets, "education"], hash_bucket_size=64)
        deep = [fc.embedding_column(occupation, dimension=4), fc.embedding_column(crossed, 4),
                fc.indicator_column(education), fc.indicator_column(country), age, hours]
        wide = [age_buckets, crossed, education, occupation, country]
        spec = fc.make_parse_example_spec(deep + wide)
        spec["label"] = tf.io.FixedLenFeature([1], tf.int64)
        ds = tf.data.TFRecordDataset(files)
        return ds.batch(g.BATCH, drop_remainder=True).map(
            lambda serialized: tf.io.parse_example(serialized, spec))
    columns = ["label"] + g.DFM_INTS + g.DFM_CATS
    defaults = [[0]] + [[0] for _ in g.DFM_INTS] + [[""] for _ in g.DFM_CATS]

    def parse(lines):
        return dict(zip(columns, tf.io.decode_csv(lines, record_defaults=defaults,
                                                  field_delim=",")))

    return tf.data.TextLineDataset(files).batch(g.BATCH, drop_remainder=True).map(parse)


def tensor_ref(name):
    node, _, idx = name.partition(":")
    return node, int(idx or 0)


def input_ref(inp):
    if inp.startswith("^"):
        return inp[1:], None
    return tensor_ref(inp)


class Region:
    """The data-side region of the plan's stages, imported from the graph: the subgraph
    from IteratorGetNext's outputs (sparse components: DeserializeSparse's outputs) and the
    lookup tables to every tensor the plan's stages send."""

    def __init__(self, model_dir, plan_dir, element_spec):
        import tensorflow as tf

        with open(os.path.join(plan_dir, "plan.json")) as f:
            plan = json.load(f)
        self.sends = []
        for stage in plan["stages"]:
            for t in stage["send"]["tensors"]:
                if t["tensor"] not in self.sends:
                    self.sends.append(t["tensor"])
        gd = read_graph(os.path.join(model_dir, "model_peer.pb"))
        nodes = {n.name: n for n in gd.node}
        get_next = [n for n in gd.node if n.op == "IteratorGetNext"]
        if len(get_next) != 1:
            die(f"{model_dir}: expected one IteratorGetNext, found {len(get_next)}")
        get_next = get_next[0].name
        # the element's flat components, a SparseTensor as one (as IteratorGetNext has them)
        flat = tf.nest.flatten(element_spec, expand_composites=False)
        keys = sorted(element_spec) if isinstance(element_spec, dict) else None
        if keys is None:
            die("the source's element is not a dict")
        self.sparse = {k for k in keys if isinstance(element_spec[k], tf.SparseTensorSpec)}
        types = nodes[get_next].attr["output_types"].list.type
        if len(types) != len(flat):
            die(f"IteratorGetNext has {len(types)} outputs, the source {len(flat)} components")
        for k, (name, dtype) in enumerate(zip(keys, types)):
            want = tf.variant if name in self.sparse else element_spec[name].dtype
            if tf.as_dtype(dtype) != want:
                die(f"IteratorGetNext:{k} is {tf.as_dtype(dtype).name}, "
                    f"the source's '{name}' {want.name}")
        # cut points: IteratorGetNext:k (dense), DeserializeSparse(IteratorGetNext:k):i (sparse)
        self.cuts = {}  # tensor name -> (component, None | sparse part index)
        for k, name in enumerate(keys):
            if name not in self.sparse:
                self.cuts[f"{get_next}:{k}"] = (name, None)
        for n in gd.node:
            if n.op == "DeserializeSparse":
                src, idx = input_ref(n.input[0])
                if src == get_next and keys[idx] in self.sparse:
                    for i in range(3):
                        self.cuts[f"{n.name}:{i}"] = (keys[idx], i)
        # the closure of the sends, stopping at cuts and tables
        keep, tables, todo = set(), set(), [tensor_ref(s)[0] for s in self.sends]
        cut_nodes = {tensor_ref(c)[0] for c in self.cuts}
        while todo:
            name = todo.pop()
            if name in keep or name in tables or name in cut_nodes:
                continue
            node = nodes.get(name)
            if node is None:
                die(f"the plan sends from '{name}', which model_peer.pb does not have")
            if node.op in TABLE_OPS:
                tables.add(name)
                continue
            if node.op in ("IteratorGetNext", "IteratorV2", "MakeIterator", "VarHandleOp",
                           "VariableV2", "ReadVariableOp"):
                die(f"the region reaches '{name}' ({node.op}) other than through a cut")
            keep.add(name)
            for inp in node.input:
                todo.append(input_ref(inp)[0])
        self.tables = sorted(tables)
        # the pruned graph: kept nodes, inputs from cuts and tables renamed to placeholders
        sub = tf.compat.v1.GraphDef()
        sub.versions.CopyFrom(gd.versions)
        placeholders = {}

        def rename(inp):
            ctrl = inp.startswith("^")
            src, idx = input_ref(inp)
            ref = f"{src}:{idx}" if not ctrl else None
            if ref in self.cuts:
                new = "lode_peer/cut/" + ref.replace(":", "/")
                placeholders[new] = ref
                return new
            if src in tables:
                new = "lode_peer/table/" + src
                placeholders[new] = src
                return ("^" + new) if ctrl else new
            if src in cut_nodes:
                if ctrl:
                    return None
                die(f"the region reads {ref}, which is neither a dense output of {get_next} "
                    "nor a DeserializeSparse of a sparse one")
            return inp

        for name in sorted(keep):
            node = sub.node.add()
            node.CopyFrom(nodes[name])
            if "_class" in node.attr:  # colocation with nodes outside the region
                del node.attr["_class"]
            inputs = [r for r in (rename(i) for i in node.input) if r is not None]
            del node.input[:]
            node.input.extend(inputs)
        for new, orig in placeholders.items():
            p = sub.node.add()
            p.name, p.op = new, "Placeholder"
            if orig in self.cuts:
                comp, part = self.cuts[orig]
                dtype = (element_spec[comp].dtype if part is None else
                         [tf.int64, element_spec[comp].dtype, tf.int64][part])
            else:
                dtype = tf.resource
            p.attr["dtype"].type = dtype.as_datatype_enum
        used_fns = {n.op for n in sub.node}
        for fn in gd.library.function:
            if fn.signature.name in used_fns:
                sub.library.function.add().CopyFrom(fn)
        self.graph = sub
        self.placeholders = placeholders
        self.table_objects = self._make_tables(gd, nodes, model_dir)

    def _make_tables(self, gd, nodes, model_dir):
        """The graph's lookup tables, made eagerly with the contents their initializers give."""
        import tensorflow as tf

        inits = {}
        for n in gd.node:
            if n.op in TABLE_INIT_OPS:
                inits[input_ref(n.input[0])[0]] = n
        fetch = {}
        for t in self.tables:
            init = inits.get(t)
            if init is None:
                die(f"table '{t}' has no initializer in the graph")
            fetch[t] = [i for i in init.input[1:] if not i.startswith("^")]
        values = {}
        if fetch:
            g = tf.Graph()
            with g.as_default():
                tf.graph_util.import_graph_def(gd, name="")
            names = [x for v in fetch.values() for x in v]
            with tf.compat.v1.Session(graph=g) as sess:
                got = sess.run([g.get_tensor_by_name(x if ":" in x else x + ":0") for x in names])
            values = dict(zip(names, got))
        out = {}
        for t in self.tables:
            attr = nodes[t].attr
            kd, vd = tf.as_dtype(attr["key_dtype"].type), tf.as_dtype(attr["value_dtype"].type)
            init = inits[t]
            default = "" if vd == tf.string else -1
            if init.op == "InitializeTableFromTextFileV2":
                path = values[fetch[t][0]].decode()
                if not os.path.isabs(path):
                    path = os.path.join(model_dir, path)
                a = init.attr
                initializer = tf.lookup.TextFileInitializer(
                    path, kd, a["key_index"].i, vd, a["value_index"].i,
                    vocab_size=a["vocab_size"].i if a["vocab_size"].i > 0 else None,
                    delimiter=a["delimiter"].s.decode())
            else:
                keys, vals = (values[x] for x in fetch[t])
                initializer = tf.lookup.KeyValueTensorInitializer(
                    tf.constant(keys, kd), tf.constant(vals, vd))
            out[t] = tf.lookup.StaticHashTable(initializer, default)
        return out

    def __call__(self, element):
        import tensorflow as tf

        def cut(ref):
            comp, part = self.cuts[ref]
            v = element[comp]
            return v if part is None else (v.indices, v.values, v.dense_shape)[part]

        input_map = {}
        for new, orig in self.placeholders.items():
            input_map[new + ":0"] = cut(orig) if orig in self.cuts else tf.identity(
                self.table_objects[orig].resource_handle)
        inner = [s for s in self.sends if s not in self.cuts]
        outs = dict(zip(inner, tf.graph_util.import_graph_def(
            self.graph, input_map=input_map, return_elements=inner, name="region")
            if inner else []))
        return tuple(cut(s) if s in self.cuts else outs[s] for s in self.sends)


def make_dataset(model_dir, plan_dir, files, regions=None):
    """The fixture's pipeline over `files`, then the plan's region, then repeat(). `regions`
    caches the imported regions (and their tables) by plan."""
    model_dir, plan_dir = os.path.abspath(model_dir), os.path.abspath(plan_dir)
    files = [os.path.abspath(f) for f in files]
    model = os.path.basename(os.path.normpath(model_dir))
    cwd = os.getcwd()
    os.chdir(model_dir)  # the fixture's relative paths (the vocabulary file) resolve here
    try:
        source = fixture_source(model, files)
        regions = {} if regions is None else regions
        if plan_dir not in regions:
            regions[plan_dir] = Region(model_dir, plan_dir, source.element_spec)
        region = regions[plan_dir]
        ds = source.map(region).repeat()
    finally:
        os.chdir(cwd)
    return ds, region


# --------------------------------------------------------------------------- check


def cmd_check(args):
    """The tf.data pipeline's elements against `lode exec --dump` of the same plan."""
    import numpy as np
    import tensorflow as tf

    model = os.path.basename(os.path.normpath(args.model_dir))
    rel = MODELS[model][0]
    ds, region = make_dataset(args.model_dir, args.plan, [os.path.join(args.model_dir, rel)])
    for step, element in enumerate(ds.take(args.steps)):
        for k, got in enumerate(element):
            path = os.path.join(args.dump, f"step_{step}", f"{k}.pb")
            proto = tf.make_tensor_proto(0)
            with open(path, "rb") as f:
                proto.ParseFromString(f.read())
            want = tf.make_ndarray(proto)
            got = got.numpy()
            same = got.shape == want.shape and got.dtype == want.dtype
            if same and got.dtype.kind == "f":
                # x / c: Lode multiplies by 1/c as grappler rewrites it in a session; tf.data's
                # function runtime divides, so a float may be 1 ulp apart (docs/architecture.md, "Stage
                # equivalence")
                bits = np.dtype(f"i{got.dtype.itemsize}")
                ulps = np.abs(got.view(bits).astype(np.int64) - want.view(bits))
                same = bool((ulps <= 1).all())
            elif same:
                same = np.array_equal(got, want)
            if not same:
                die(f"{model}: step {step}: {region.sends[k]} differs from Lode's "
                    f"({got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)})")
    print(f"{model} {os.path.basename(args.plan)}: the tf.data pipeline's {args.steps} steps "
          f"x {len(region.sends)} tensors equal lode exec's")


# --------------------------------------------------------------------------- tf.data service


def quiet_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def serve_until_stopped(server, ready_file, text):
    # SIGTERM keeps its default action (the process ends at once): a Python handler would
    # never run while the main thread waits in server.join()
    tmp = ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, ready_file)
    server.join()


def cmd_tf_dispatcher(args):
    tf = quiet_tf()
    svc = tf.data.experimental.service
    # Jobs of finished configurations are collected quickly so that the next one runs alone.
    server = svc.DispatchServer(svc.DispatcherConfig(
        port=0, job_gc_check_interval_ms=200, job_gc_timeout_ms=200))
    serve_until_stopped(server, args.ready, server.target)


def cmd_tf_worker(args):
    tf = quiet_tf()
    svc = tf.data.experimental.service
    address = args.dispatcher.split("://", 1)[-1]
    server = svc.WorkerServer(svc.WorkerConfig(
        dispatcher_address=address, port=0, heartbeat_interval_ms=200))
    serve_until_stopped(server, args.ready, str(os.getpid()))


def cmd_tf_consume(args):
    import faulthandler
    import gc

    tf = quiet_tf()
    pids = parse_pids(args.pids) + [("consumer", os.getpid())]
    regions = {}
    for cfg in args.config:
        try:
            model, cut, mode, loop = cfg.split(":")
        except ValueError:
            die(f"--config {cfg}: not MODEL:CUT:MODE:LOOP")
        model_dir = os.path.join(args.data, model)
        files = (shard_files(model_dir, model) if mode == "distributed_epoch"
                 else [os.path.join(model_dir, MODELS[model][0])])
        ds, region = make_dataset(model_dir, os.path.join(model_dir, f"plan-{cut}"), files,
                                  regions)
        ds = ds.apply(tf.data.experimental.service.distribute(
            processing_mode=mode, service=args.dispatcher))
        it = iter(ds)
        faulthandler.dump_traceback_later(args.timeout, exit=True)  # a stuck service fails
        if loop == "function":
            @tf.function
            def run(n):
                total = tf.constant(0, tf.int64)
                for _ in tf.range(n):
                    for t in next(it):
                        total += tf.cast(tf.size(t), tf.int64)
                return total

            def chunk(n):
                run(tf.constant(n))
        else:
            def chunk(n):
                for _ in range(n):
                    next(it)
        label = f"tf.data service, {mode}, {plural(args.workers)}, consumer in " + (
            "a tf.function" if loop == "function" else "a Python loop")
        row = measure(chunk, pids, args, steps_per_chunk=args.chunk)
        faulthandler.cancel_dump_traceback_later()
        extra = {"model": model, "engine": "tf.data service", "mode": mode, "loop": loop,
                 "workers": args.workers, "round": args.round, "cut": cut}
        emit(args.out, result(label, row[0], row[1], BATCH, extra))
        del it, ds, chunk
        gc.collect()
        time.sleep(args.settle)  # the finished job's tasks leave the workers


def measure(chunk, pids, args, steps_per_chunk):
    """Runs chunks until warmup has passed, then over the window; returns two snapshots."""
    start, steps, first = time.monotonic(), 0, None
    while True:
        chunk(steps_per_chunk)
        steps += steps_per_chunk
        now = time.monotonic()
        if first is None and now - start >= args.warmup:
            first = snapshot(pids, steps)
        elif first is not None and now - first["t"] >= args.window:
            return first, snapshot(pids, steps)


# --------------------------------------------------------------------------- Lode


class LogLines:
    """Counts the complete lines of a growing log, reading only what was added since the last
    count (a consumer's log has a line per step)."""

    def __init__(self, path):
        self.path, self.count, self.offset = path, 0, 0

    def __call__(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.count
        cut = data.rfind(b"\n") + 1
        self.count += data.count(b"\n", 0, cut)
        self.offset += cut
        return self.count


def cmd_lode_sample(args):
    """Measures a running Lode job: progress is the consumer's log (one line per step)."""
    pids = parse_pids(args.pids)
    deadline = time.monotonic() + args.timeout
    first, started = None, None
    lines = LogLines(args.log)
    last = -1
    while True:
        n = lines()
        now = time.monotonic()
        for name, pid in pids:
            try:
                cpu_ticks(pid)
            except (FileNotFoundError, ProcessLookupError):
                die(f"{args.label}: the {name} (pid {pid}) exited after {n} steps")
        if now > deadline:
            die(f"{args.label}: {n} steps after {args.timeout} s, the window did not end")
        if n != last:  # snapshots are taken just after a step is logged
            last = n
            if started is None and n > 0:
                started = now
            if first is None and started is not None and now - started >= args.warmup:
                first = snapshot(pids, n)
            elif first is not None and now - first["t"] >= args.window:
                second = snapshot(pids, n)
                break
        time.sleep(0.005)
    extra = {"model": args.model, "engine": "lode", "cut": args.cut, "workers": args.workers,
             "round": args.round}
    emit(args.out, result(args.label, first, second, BATCH, extra))


def exec_once(args, steps):
    """One `lode exec --threads 1` run of `steps` steps of args.plan's stage args.stage: its
    JSON report, which counts its CPU over the steps (`cpu_seconds`, and its pool threads'
    part, `step_threads_cpu_seconds`). On the worker's CPU under `--pin`."""
    cmd = [args.lode, "exec", args.plan, "--stage", str(args.stage), "--steps", str(steps),
           "--threads", "1", "--format", "json"]
    pin = PIN_WORKER if getattr(args, "pin", False) else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=on_cpus(pin))
    out, err = p.communicate()
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {err.decode()[-2000:]}")
    report = json.loads(out.decode().strip().splitlines()[-1])
    if report.get("cpu_seconds", 0) <= 0 or "step_threads_cpu_seconds" not in report:
        die(f"{' '.join(cmd)}: no CPU over its steps in its report (cpu_seconds, "
            f"step_threads_cpu_seconds): is {args.lode} current?")
    return report


def cmd_exec_cpu(args):
    """`lode exec --threads 1`: samples per CPU-second, by exec's own count of its CPU over
    the steps (its process CPU clock; the loading, 0.02 to 0.13 s here, is not in it). The run
    is taken three times and its least CPU a step kept: what disturbs a run (another process,
    the page cache) only ever adds CPU."""
    def run():
        report = exec_once(args, args.steps)
        if report.get("samples", 0) <= 0:
            die(f"lode exec {args.plan}: no samples")
        return report

    report = max((run() for _ in range(3)), key=lambda r: r["samples"] / r["cpu_seconds"])
    row = {"model": args.model, "engine": "lode exec", "cut": args.cut, "round": args.round,
           "config": "lode exec --threads 1", "samples_per_sec": report["samples_per_sec"],
           "samples_per_cpu_sec": report["samples"] / report["cpu_seconds"]}
    emit(args.out, row)


class OneWorkerJob:
    """A job of one worker on `args.plan`: `lode dispatcher`, one `lode worker --metrics` and
    `lode consume --step-time 0` logging each step to a file, in a scratch directory; `what`
    names the subcommand in errors. `start` returns once a step was delivered."""

    def __init__(self, args, what):
        import tempfile
        self.args, self.what = args, what
        self.work = tempfile.mkdtemp(prefix="lode-eff-")
        self.procs = []

    def spawn(self, name, cmd, stdout=subprocess.DEVNULL):
        cpus = None
        if getattr(self.args, "pin", False):
            cpus = PIN_WORKER if name == "worker" else PIN_REST
        return spawn_logged(self.procs, self.work, name, cmd, stdout, cpus)

    def processes(self):
        return [p for _, p in self.procs]

    def check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                with open(os.path.join(self.work, f"{name}.err"), "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                die(f"{self.what} {self.args.plan}: the {name} exited ({p.returncode}): {tail}")

    def start(self):
        args, work, what = self.args, self.work, self.what
        log = os.path.join(work, "consumer.jsonl")
        addr_file = os.path.join(work, "dispatcher.addr")
        self.spawn("dispatcher", [args.lode, "dispatcher", "--plan", args.plan, "--journal",
                                  os.path.join(work, "journal"), "--token", "eff",
                                  "--addr-file", addr_file, "-q"])
        deadline = time.monotonic() + 60
        while not (os.path.exists(addr_file) and os.path.getsize(addr_file) > 0):
            self.check_alive()
            if time.monotonic() > deadline:
                die(f"{what} {args.plan}: the dispatcher wrote no address in 60 s")
            time.sleep(0.02)
        with open(addr_file) as f:
            addr = f.read().strip()
        worker_out = os.path.join(work, "worker.out")
        self.worker = self.spawn("worker", [args.lode, "worker", "--dispatcher", addr,
                                            "--token", "eff", "--name", "eff", "--metrics",
                                            "127.0.0.1:0"],
                                 stdout=open(worker_out, "wb"))
        self.consumer = self.spawn("consumer", [args.lode, "consume", "--dispatcher", addr,
                                                "--token", "eff", "--log", log,
                                                "--step-time", "0", "-q"])
        self.steps_logged = LogLines(log)
        deadline = time.monotonic() + 60
        while self.steps_logged() == 0:
            self.check_alive()
            if time.monotonic() > deadline:
                die(f"{what} {args.plan}: no step delivered in 60 s")
            time.sleep(0.02)
        with open(worker_out) as f:
            self.url = next((w for w in f.read().split() if w.startswith("http://")), None)
        if self.url is None:
            die(f"{what} {args.plan}: the worker printed no metrics address")

    def stop(self):
        stop_all(self.procs, self.work)


def cmd_worker_eff(args):
    """One worker's samples per CPU-second against `lode exec --threads 1`'s, measured in
    alternation on one running job: a window of the worker (dispatcher, one worker and
    `lode consume --step-time 0`), then the job is stopped (SIGSTOP) while `lode exec` runs,
    then it goes on (SIGCONT) and settles before the next window. Both sides are CPU totals
    over runs of about the same length, taken seconds apart, so that a host whose speed
    drifts over minutes weighs on both alike. exec's CPU is its own count over the steps
    (its process CPU clock; the loading before them not in it).

    The steady ratio takes the host's speed out: each side's share of its CPU spent on the
    steps (the worker's stage and freeing, as its metrics time them; exec's pool threads,
    which run the steps, free their tensors and keep the pool), each from its own run, one
    over the other. The plain ratio is exec's CPU a step over the worker's; the steady ratio
    is the same had both done a step's work at one speed.

    The worker's metrics endpoint splits its side: the stage's own time per step (as its
    metrics count it) and the rest of its CPU per step (the overhead: transport, RPCs,
    bookkeeping). exec's time per step over the stage's in the worker is the ratio the worker
    would reach with no overhead at all: below 1 when the stage itself runs slower in the
    running job (its neighbours on the other core, the transport's cache traffic) than in
    exec alone."""
    import signal

    check_pin(args, "worker-eff")
    job = OneWorkerJob(args, "worker-eff")
    rows = []
    try:
        job.start()
        worker, steps_logged, check_alive = job.worker, job.steps_logged, job.check_alive
        url = job.url
        time.sleep(args.warmup)
        for r in range(1, args.rounds + 1):
            check_alive()
            m0 = worker_counters(url)
            s0, c0, t0 = steps_logged(), cpu_ticks(worker.pid), time.monotonic()
            w0 = run_queue_wait_ns(worker.pid)
            time.sleep(args.window)
            s1, c1, t1 = steps_logged(), cpu_ticks(worker.pid), time.monotonic()
            w1 = run_queue_wait_ns(worker.pid)
            m1 = worker_counters(url)
            for p in job.processes():
                p.send_signal(signal.SIGSTOP)
            try:
                # As many steps as the worker delivered in its window: exec, the faster,
                # runs no longer than the window, and the job's pause stays well under the
                # dispatcher's patience (5 missed heartbeats).
                steps = max(args.min_exec_steps, s1 - s0)
                report = exec_once(args, steps)
            finally:
                for p in job.processes():
                    p.send_signal(signal.SIGCONT)

            def delta(key):
                return m1.get(key, 0.0) - m0.get(key, 0.0)
            computed = m1["lode_worker_steps_computed_total"] - m0["lode_worker_steps_computed_total"]
            compute = (m1["lode_worker_compute_seconds_total"]
                       - m0["lode_worker_compute_seconds_total"])
            release = (m1["lode_worker_release_seconds_total"]
                       - m0["lode_worker_release_seconds_total"])
            rows.append({"round": r, "worker_samples": (s1 - s0) * BATCH,
                         "worker_cpu_s": (c1 - c0) / TICK, "window_s": t1 - t0,
                         "worker_cpu_clock_s": delta("process_cpu_seconds_total"),
                         "worker_steps_computed": computed, "worker_compute_s": compute,
                         "worker_release_s": release,
                         "worker_wait_s": (w1 - w0) / 1e9,
                         "worker_stage_cpu_s": delta("lode_worker_stage_cpu_seconds_total"),
                         "worker_stage_cpu_steps": delta("lode_worker_stage_cpu_steps_total"),
                         "worker_stage_cpu_wall_s": delta(
                             "lode_worker_stage_cpu_wall_seconds_total"),
                         "exec_steps": steps, "exec_samples": report["samples"],
                         "exec_cpu_s": report["cpu_seconds"],
                         "exec_step_threads_cpu_s": report["step_threads_cpu_seconds"]})
            time.sleep(args.settle)
        check_alive()
    finally:
        job.stop()
    for row in rows:
        if row["worker_samples"] <= 0 or row["worker_cpu_s"] <= 0:
            die(f"worker-eff {args.plan}: round {row['round']}: the worker delivered nothing")
        exec_cpu = row["exec_cpu_s"]
        row["worker_rate"] = row["worker_samples"] / row["worker_cpu_s"]
        row["exec_rate"] = row["exec_samples"] / exec_cpu
        row["ratio"] = row["worker_rate"] / row["exec_rate"]
        if row["worker_steps_computed"] <= 0:
            die(f"worker-eff {args.plan}: round {row['round']}: the worker computed nothing")
        # Per step: exec's CPU; the worker's stage time and its CPU (both over the steps it
        # computed in the window); the difference is the worker's overhead.
        row["exec_us_per_step"] = exec_cpu / row["exec_steps"] * 1e6
        row["compute_us_per_step"] = row["worker_compute_s"] / row["worker_steps_computed"] * 1e6
        row["worker_us_per_step"] = row["worker_cpu_s"] / row["worker_steps_computed"] * 1e6
        row["overhead_us_per_step"] = row["worker_us_per_step"] - row["compute_us_per_step"]
        row["stage_ratio"] = row["exec_us_per_step"] / row["compute_us_per_step"]
        # The ratio had the stage run as fast in the worker as in exec: the stage's share of
        # the worker's CPU, both from the same window, so the host's speed (which swings
        # between the worker's window and exec's run) cancels out. Conservative: the
        # overhead includes dropping the sent tensors, which exec's step pays too.
        row["ratio_same_stage"] = row["compute_us_per_step"] / row["worker_us_per_step"]
        # The same with the worker's freeing of the steps' tensors counted with the stage, as
        # exec's step counts it (exec frees each step's tensors as it ends; the worker, once
        # the receiver took them).
        row["release_us_per_step"] = row["worker_release_s"] / row["worker_steps_computed"] * 1e6
        row["ratio_same_step"] = ((row["compute_us_per_step"] + row["release_us_per_step"])
                                  / row["worker_us_per_step"])
        # Each side's steady figure from its own run, by its process CPU clock, and their
        # ratio (see above); the step-work ratio says how the two runs' steps compared in
        # CPU (exec's pool threads a step over the worker's stage and freeing a step): 1 at
        # one speed, and what the steady ratio takes out.
        if row["worker_cpu_clock_s"] <= 0:
            die(f"worker-eff {args.plan}: round {row['round']}: the worker's metrics have no "
                f"process_cpu_seconds_total")
        work = row["worker_compute_s"] + row["worker_release_s"]
        row["worker_steady"] = work / row["worker_cpu_clock_s"]
        row["exec_steady"] = row["exec_step_threads_cpu_s"] / exec_cpu
        row["steady_ratio"] = row["worker_steady"] / row["exec_steady"]
        row["step_work_ratio"] = ((row["exec_step_threads_cpu_s"] / row["exec_steps"])
                                  / (work / row["worker_steps_computed"]))
        # Both figures above count the stage by its wall time. The worker's threads wait for
        # a CPU part of the window (the consumer and the dispatcher share the machine), and
        # a wait inside the stage would make them read high. The worker times a sample of its
        # steps by its thread's CPU clock too: on those steps, the stage's CPU over its wall
        # time says how much of that wall time the stage ran (above 1 by the clock's own
        # system calls).
        row["wait_share"] = row["worker_wait_s"] / row["window_s"]
        if row["worker_stage_cpu_steps"] > 0 and row["worker_stage_cpu_wall_s"] > 0:
            row["stage_cpu_us_per_step"] = (row["worker_stage_cpu_s"]
                                            / row["worker_stage_cpu_steps"] * 1e6)
            row["stage_cpu_over_wall"] = (row["worker_stage_cpu_s"]
                                          / row["worker_stage_cpu_wall_s"])
    pooled = (sum(r["worker_samples"] for r in rows) / sum(r["worker_cpu_s"] for r in rows)) / (
        sum(r["exec_samples"] for r in rows) / sum(r["exec_cpu_s"] for r in rows))
    summary = {"model": args.model, "cut": args.cut, "rounds": len(rows),
               "window_s": args.window, "pinned": args.pin,
               "worker_samples_per_cpu_sec": statistics.median(r["worker_rate"] for r in rows),
               "exec_samples_per_cpu_sec": statistics.median(r["exec_rate"] for r in rows),
               "ratio_median": statistics.median(r["ratio"] for r in rows),
               "ratio_min": min(r["ratio"] for r in rows),
               "ratio_max": max(r["ratio"] for r in rows),
               "ratio_pooled": pooled,
               "exec_us_per_step": statistics.median(r["exec_us_per_step"] for r in rows),
               "compute_us_per_step": statistics.median(r["compute_us_per_step"] for r in rows),
               "overhead_us_per_step": statistics.median(r["overhead_us_per_step"]
                                                         for r in rows),
               "stage_ratio_median": statistics.median(r["stage_ratio"] for r in rows),
               "ratio_same_stage_median": statistics.median(r["ratio_same_stage"]
                                                            for r in rows),
               "release_us_per_step": statistics.median(r["release_us_per_step"]
                                                        for r in rows),
               "ratio_same_step_median": statistics.median(r["ratio_same_step"]
                                                           for r in rows),
               "wait_share_median": statistics.median(r["wait_share"] for r in rows),
               "worker_steady_median": statistics.median(r["worker_steady"] for r in rows),
               "exec_steady_median": statistics.median(r["exec_steady"] for r in rows),
               "steady_ratio_median": statistics.median(r["steady_ratio"] for r in rows),
               "steady_ratio_min": min(r["steady_ratio"] for r in rows),
               "steady_ratio_max": max(r["steady_ratio"] for r in rows),
               "step_work_ratio_median": statistics.median(r["step_work_ratio"]
                                                           for r in rows),
               "rounds_detail": rows}
    timed = [r for r in rows if "stage_cpu_over_wall" in r]
    if timed:
        summary["stage_cpu_us_per_step"] = statistics.median(r["stage_cpu_us_per_step"]
                                                             for r in timed)
        summary["stage_cpu_over_wall_median"] = statistics.median(r["stage_cpu_over_wall"]
                                                                  for r in timed)
    append_json(args.out, summary)
    print(f"{args.model} {args.cut}{' (pinned)' if args.pin else ''}: worker "
          f"{summary['worker_samples_per_cpu_sec']:,.0f} / "
          f"exec {summary['exec_samples_per_cpu_sec']:,.0f} samples per CPU-s; ratio median "
          f"{summary['ratio_median']:.2f} (rounds {summary['ratio_min']:.2f}-"
          f"{summary['ratio_max']:.2f}), pooled {pooled:.2f}, {len(rows)} rounds; per step: "
          f"exec {summary['exec_us_per_step']:.1f} us, the worker's stage "
          f"{summary['compute_us_per_step']:.1f} us (stage ratio "
          f"{summary['stage_ratio_median']:.2f}) + overhead "
          f"{summary['overhead_us_per_step']:.1f} us (freeing the tensors "
          f"{summary['release_us_per_step']:.1f}); at a stage ratio of 1 "
          f"{summary['ratio_same_stage_median']:.2f}, with the freeing counted as exec's "
          f"step counts it {summary['ratio_same_step_median']:.2f}; the worker waited for a "
          f"CPU {summary['wait_share_median']:.0%} of the window")
    print(f"    steady ratio {summary['steady_ratio_median']:.3f} (rounds "
          f"{summary['steady_ratio_min']:.3f}-{summary['steady_ratio_max']:.3f}): the worker's "
          f"stage and freeing over its CPU {summary['worker_steady_median']:.3f}, exec's pool "
          f"threads over its CPU {summary['exec_steady_median']:.3f}; exec's step work over the "
          f"worker's {summary['step_work_ratio_median']:.3f}")
    if timed:
        print(f"    the stage by its thread's CPU clock (1 step in 64): "
              f"{summary['stage_cpu_us_per_step']:.1f} us a step, "
              f"{summary['stage_cpu_over_wall_median']:.2f} of its wall time on the same steps")


def cmd_consumer_cost(args):
    """What the training side's receiver costs a step on one running job: `lode consume
    --step-time 0` (the receiver, with the emulator's digest and log of each step) beside one
    worker, in windows: the steps delivered per second, the consumer's CPU a step, its threads'
    context switches a step (/proc), and, where `perf` can count them, its system calls a
    step (all of them, and futex and recvfrom)."""
    import shutil

    job = OneWorkerJob(args, "consumer-cost")
    rows = []
    events = "raw_syscalls:sys_enter,syscalls:sys_enter_futex,syscalls:sys_enter_recvfrom"
    perf = shutil.which("perf")
    try:
        job.start()
        time.sleep(args.warmup)
        for r in range(1, args.rounds + 1):
            job.check_alive()
            pid = job.consumer.pid
            s0, c0, x0, t0 = job.steps_logged(), cpu_ticks(pid), context_switches(pid), \
                time.monotonic()
            counts = {}
            if perf:
                out = subprocess.run([perf, "stat", "-x,", "-e", events, "-p", str(pid), "--",
                                      "sleep", str(args.window)], capture_output=True, text=True)
                for line in out.stderr.splitlines():
                    fields = line.split(",")
                    if out.returncode == 0 and len(fields) > 2 and fields[0].isdigit():
                        counts[fields[2].rsplit(":", 1)[-1]] = int(fields[0])
            else:
                time.sleep(args.window)
            s1, c1, x1, t1 = job.steps_logged(), cpu_ticks(pid), context_switches(pid), \
                time.monotonic()
            steps = s1 - s0
            if steps <= 0:
                die(f"consumer-cost {args.plan}: round {r}: nothing delivered")
            row = {"round": r, "steps_per_sec": steps / (t1 - t0),
                   "consumer_us_per_step": (c1 - c0) / TICK / steps * 1e6,
                   "switches_per_step": (x1 - x0) / steps}
            for name, key in (("sys_enter", "syscalls_per_step"),
                              ("sys_enter_futex", "futex_per_step"),
                              ("sys_enter_recvfrom", "recvfrom_per_step")):
                if name in counts:
                    row[key] = counts[name] / steps
            rows.append(row)
    finally:
        job.stop()
    summary = {"model": args.model, "cut": args.cut, "rounds": len(rows),
               "window_s": args.window, "rounds_detail": rows}
    for key in ("steps_per_sec", "consumer_us_per_step", "switches_per_step",
                "syscalls_per_step", "futex_per_step", "recvfrom_per_step"):
        if all(key in r for r in rows):
            summary[key] = statistics.median(r[key] for r in rows)
    append_json(args.out, summary)
    counted = (f"; system calls {summary['syscalls_per_step']:.2f} a step (futex "
               f"{summary['futex_per_step']:.2f}, recvfrom {summary['recvfrom_per_step']:.2f})"
               if "syscalls_per_step" in summary else "; no system calls counted (no perf)")
    print(f"{args.model} {args.cut}: {summary['steps_per_sec']:,.0f} steps/s; the consumer "
          f"{summary['consumer_us_per_step']:.1f} us of CPU and "
          f"{summary['switches_per_step']:.2f} context switches a step{counted} "
          f"(medians of {len(rows)} rounds)")


def cmd_exec_transport(args):
    """`lode exec --transport` in alternating short runs: the stepping thread's CPU a step
    with nothing sent, with each step's frame encoded, and encoded and written to loopback in
    bursts, round by round (a host whose speed drifts weighs on the three alike). Each
    round's ratio of nothing sent over the other two is the share of a worker's CPU its stage
    would have with no cost besides its frame: a worker's ceiling on the target's ratio. The
    stages and the freeing over the thread's CPU within one run (`steady`) is the same ceiling
    by the worker's steady figure, which the host's swings between runs do not move."""
    modes = ("none", "encode", "loopback")
    rows = []
    for r in range(1, args.rounds + 1):
        row = {"round": r}
        for mode in modes:
            cmd = [args.lode, "exec", args.plan, "--stage", str(args.stage), "--steps",
                   str(args.steps), "--transport", mode, "--format", "json"]
            p = subprocess.run(cmd, capture_output=True)
            if p.returncode != 0:
                die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
            report = json.loads(p.stdout.decode().strip().splitlines()[-1])
            row[mode] = report["sending"]["cpu_us_per_step"]
            row[mode + "_stage"] = report["sending"]["stage_us_per_step"]
            row[mode + "_bytes"] = report["sending"]["bytes"] / max(report["steps"], 1)
            row[mode + "_steady"] = report["sending"].get("steady", 0.0)
        rows.append(row)
    summary = {"model": args.model, "cut": args.cut, "rounds": len(rows), "steps": args.steps}
    for mode in modes:
        summary[f"{mode}_us_per_step"] = statistics.median(r[mode] for r in rows)
        summary[f"{mode}_stage_us_per_step"] = statistics.median(r[mode + "_stage"] for r in rows)
    for mode in ("encode", "loopback"):
        shares = [r["none"] / r[mode] for r in rows]
        summary[f"ceiling_{mode}_median"] = statistics.median(shares)
        summary[f"ceiling_{mode}_min"] = min(shares)
        summary[f"ceiling_{mode}_max"] = max(shares)
        steady = [r[mode + "_steady"] for r in rows]
        summary[f"steady_{mode}_median"] = statistics.median(steady)
        summary[f"steady_{mode}_min"] = min(steady)
        summary[f"steady_{mode}_max"] = max(steady)
    summary["bytes_per_step"] = rows[-1]["loopback_bytes"]
    summary["rounds_detail"] = rows
    append_json(args.out, summary)
    print(f"{args.model} {args.cut}: the stepping thread's CPU a step (medians of "
          f"{len(rows)} rounds of {args.steps} steps): nothing sent "
          f"{summary['none_us_per_step']:.2f} us, encoded {summary['encode_us_per_step']:.2f}, "
          f"encoded and written to loopback {summary['loopback_us_per_step']:.2f} "
          f"({summary['bytes_per_step']:.0f} bytes a step); nothing sent over the others "
          f"{summary['ceiling_encode_median']:.3f} and {summary['ceiling_loopback_median']:.3f} "
          f"(rounds {summary['ceiling_loopback_min']:.3f}-{summary['ceiling_loopback_max']:.3f}); "
          f"the stages and the freeing over the CPU within each run (a worker's steady figure "
          f"with nothing but its frame's cost) {summary['steady_encode_median']:.3f} encoded, "
          f"{summary['steady_loopback_median']:.3f} on loopback "
          f"(rounds {summary['steady_loopback_min']:.3f}-{summary['steady_loopback_max']:.3f})")


# --------------------------------------------------------------------------- the table


def cmd_table(args):
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    if not rows:
        die(f"{args.results}: no results")
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["cut"], r["config"]), []).append(r)
    med = statistics.median
    engines = {"tf.data service": 0, "lode": 1, "lode exec": 2}

    def order(key):
        r = groups[key][0]
        return (key[0] != "wide_deep", key[1] != "simple", engines[r["engine"]],
                r.get("mode", "") != "parallel_epochs", r.get("loop", "") != "function",
                r.get("workers", 0))

    def fmt(v, digits=1):
        return "–" if v is None else f"{v:,.{digits}f}"

    print("| model | work | configuration | rounds | samples/s | dispatcher | worker (each) "
          "| consumer | all processes |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    exec_rate, worker_rate = {}, {}
    # Per round, for the paired ratio: the worker's and exec's samples per CPU-second.
    round_worker, round_exec = {}, {}
    for key in sorted(groups, key=order):
        model, cut, config = key
        rs = groups[key]
        rate = med(r["samples_per_sec"] for r in rs)
        head = f"| {model} | {cut} | {config} | {len(rs)} | {rate:,.0f} |"
        if rs[0]["engine"] == "lode exec":
            exec_rate[(model, cut)] = med(r["samples_per_cpu_sec"] for r in rs)
            for r in rs:
                round_exec[(model, cut, r["round"])] = r["samples_per_cpu_sec"]
            us = 1e6 / exec_rate[(model, cut)]
            print(f"{head} – | {us:.1f} (the whole process) | – | {us:.1f} |")
            continue
        names = list(rs[0]["cpu_us_per_sample"])
        per = {n: med(r["cpu_us_per_sample"][n] for r in rs) for n in names}
        workers = [n for n in names if n.startswith("worker")]
        if rs[0]["engine"] == "lode" and len(workers) == 1:
            worker_rate[(model, cut)] = 1e6 / per[workers[0]]
            for r in rs:
                round_worker[(model, cut, r["round"])] = 1e6 / r["cpu_us_per_sample"][workers[0]]
        print(f"{head} {fmt(per.get('dispatcher'))} | {' / '.join(fmt(per[w]) for w in workers)} "
              f"| {fmt(per.get('consumer'))} | {fmt(sum(per.values()))} |")
    print()
    print("samples/s: median over rounds of the steady-state window; the other columns: CPU µs "
          "per sample of each process (utime + stime over the window), medians over rounds.")
    targets(groups)
    if exec_rate:
        print()
        print("| model | work | `lode worker` samples per CPU-s (1 worker) "
              "| `lode exec --threads 1` samples per CPU-s | ratio (target ≥ 0.90) "
              "| paired: each round's ratio | median of paired |")
        print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
        for (model, cut), e in sorted(exec_rate.items(), key=lambda kv: (kv[0][0] != "wide_deep",
                                                                         kv[0][1] != "simple")):
            w = worker_rate.get((model, cut))
            pairs = [round_worker[k] / round_exec[k] for k in sorted(round_exec)
                     if k[:2] == (model, cut) and k in round_worker]
            listed = " / ".join(f"{p:.2f}" for p in pairs) or "–"
            print(f"| {model} | {cut} | {fmt(w, 0)} | {e:,.0f} | "
                  f"{'–' if w is None else f'{w / e:.2f}'} | {listed} | "
                  f"{f'{med(pairs):.2f}' if pairs else '–'} |")
        print()
        print("paired: the worker's samples per CPU-second in a round over `lode exec`'s in the "
              "same round (with `--engines` holding both and `--workers` holding 1, exec runs "
              "right after the one-worker run of its plan).")


def targets(groups):
    """Issue 17's throughput targets as ratios of median samples/s, 2 workers each."""
    rate = {}
    for (model, cut, _), rs in groups.items():
        r = rs[0]
        key = (model, cut, r["engine"], r.get("mode"), r.get("loop"), r.get("workers"))
        rate[key] = statistics.median(x["samples_per_sec"] for x in rs)
    lines = []
    for model in ("wide_deep", "deepfm"):
        for lode_cut, tf_cut, want in (("simple", "simple", 1.5), ("full", "full", 1.0),
                                       ("full", "simple", 1.0)):
            lode = rate.get((model, lode_cut, "lode", None, None, 2))
            for mode in ("parallel_epochs", "distributed_epoch"):
                tf = rate.get((model, tf_cut, "tf.data service", mode, "function", 2))
                if lode and tf:
                    lines.append(f"| {model} | Lode {lode_cut} cut | tf.data service, {mode}, "
                                 f"{tf_cut} work | {lode / tf:.2f}x | {want:.1f}x |")
    if lines:
        print()
        print("| model | Lode, 2 workers | against tf.data service, 2 workers, consumer in a "
              "tf.function | ratio of samples/s | issue 17's target |")
        print("| --- | --- | --- | ---: | ---: |")
        print("\n".join(lines))


# --------------------------------------------------------------------------- main


def plan_command(sub, name):
    """A subcommand that runs `lode` on one cut's plan: --lode, --plan, --stage, --model,
    --cut."""
    p = sub.add_parser(name)
    p.add_argument("--lode", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--model", required=True)
    p.add_argument("--cut", required=True)
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("model_dir")
    p = sub.add_parser("check")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--steps", type=int, default=2)
    for name in ("tf-dispatcher", "tf-worker"):
        p = sub.add_parser(name)
        p.add_argument("--ready", required=True, help="file written once serving")
        if name == "tf-worker":
            p.add_argument("--dispatcher", required=True)
    for name in ("tf-consume", "lode-sample"):
        p = sub.add_parser(name)
        p.add_argument("--pids", default="", help="NAME=PID,... of the other processes")
        p.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
        p.add_argument("--window", type=float, default=5.0, help="seconds measured")
        p.add_argument("--timeout", type=float, default=120.0)
        p.add_argument("--workers", type=int, required=True)
        p.add_argument("--round", type=int, default=1)
        p.add_argument("--out", required=True, help="results.jsonl (appended)")
        if name == "tf-consume":
            p.add_argument("--dispatcher", required=True)
            p.add_argument("--data", required=True, help="the directory of the model dirs")
            p.add_argument("--config", action="append", required=True,
                           help="MODEL:simple|full:parallel_epochs|distributed_epoch:function|python"
                                " (the cut's plan is MODEL/plan-CUT)")
            p.add_argument("--chunk", type=int, default=50, help="steps between clock reads")
            p.add_argument("--settle", type=float, default=0.5)
        else:
            p.add_argument("--log", required=True)
            p.add_argument("--label", required=True)
            p.add_argument("--model", required=True)
            p.add_argument("--cut", required=True)
    p = plan_command(sub, "exec-cpu")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--round", type=int, default=1)
    p.add_argument("--out", required=True)
    p = plan_command(sub, "worker-eff")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the first window")
    p.add_argument("--window", type=float, default=2.0, help="seconds of each worker window")
    p.add_argument("--settle", type=float, default=0.5,
                   help="seconds after the job goes on before the next window")
    p.add_argument("--min-exec-steps", type=int, default=100,
                   help="the fewest steps of a round's exec run (else: the window's steps)")
    p.add_argument("--pin", action="store_true",
                   help="the worker and exec on CPU 0, the dispatcher and the consumer on CPU 1")
    p.add_argument("--out", required=True, help="results.jsonl (appended)")
    p = plan_command(sub, "consumer-cost")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the first window")
    p.add_argument("--window", type=float, default=3.0, help="seconds of each window")
    p.add_argument("--out", required=True, help="results.jsonl (appended)")
    p = plan_command(sub, "exec-transport")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=12000, help="steps of each run")
    p.add_argument("--out", required=True, help="results.jsonl (appended)")
    p = sub.add_parser("table")
    p.add_argument("results")
    args = ap.parse_args()
    {"prepare": cmd_prepare, "check": cmd_check, "tf-dispatcher": cmd_tf_dispatcher,
     "tf-worker": cmd_tf_worker, "tf-consume": cmd_tf_consume, "lode-sample": cmd_lode_sample,
     "exec-cpu": cmd_exec_cpu, "worker-eff": cmd_worker_eff,
     "exec-transport": cmd_exec_transport, "consumer-cost": cmd_consumer_cost,
     "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
