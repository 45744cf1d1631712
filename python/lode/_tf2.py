"""TensorFlow 2 programs on Lode: the program's `tf.data.Dataset` replaced where it is iterated.

`lode._hook` patches `DatasetV2` when TensorFlow's dataset module loads (`patch`):

- `iter(dataset)` (Keras's `fit`, an eager `for` loop, `iter()` inside a `tf.function`) and
  `dataset.reduce` (AutoGraph's `for x in dataset` inside a `tf.function` is a reduce) look at
  the dataset the first time it is iterated. A dataset Lode can serve is cut: its graph comes
  from the dataset itself (`_as_serialized_graph`: the dataset ops, the map functions in its
  library, the final variant behind the `_Retval` named `dataset`), wrapped into the form the
  decoupler cuts (an iterator, its `MakeIterator` and an `IteratorGetNext` whose outputs are
  read by the training side), and sent to `lode train` as a request of kind `dataset`.
- The program then iterates a stand-in with the original `element_spec` and cardinality whose
  elements are DWRecv's: each element is one of the job's steps, in TensorFlow's order.
- Each new iterator of the dataset is the next pass (the job's next epoch), as each new
  iterator of a TensorFlow dataset draws new seeds from its shuffle's seed generator: the
  iterators are counted (an eager iterator when it is created, one made inside a
  `tf.function` when it yields its first element); Keras's epoch logic is never imitated.
- The stand-in's elements carry their step numbers (`_StandIn`): the iterator's position is
  in its own state, so TensorFlow's checkpoint of the iterator (`tf.train.Checkpoint`,
  `CheckpointManager`) saves it, and an iterator restored from one resumes the job at the
  step after the checkpoint, as TensorFlow's own iterator resumes its pipeline.

- Each dataset Lode serves is a job of its own (`lode train` numbers them in the order they
  are first iterated: Keras `fit`'s training data is job 1, its `validation_data` job 2, an
  `evaluate` after it on a third dataset job 3): its stand-in's ops (DWRecv, DWSeek,
  DWPassBegin) carry the job in their `job` attribute, and the training side keeps one
  receiver per job. Iterators are counted per dataset: each new iterator of `validation_data`
  (Keras makes one per validation) is the next pass of that dataset's job.

A dataset Lode cannot serve runs unchanged with one `lode:` line saying why (status 2 under
`lode train --strict`); so does a dataset after a TF1 session's graph was cut (one job per TF1
program).
"""

import json
import os
import sys

_REPLACED = "_lode_replacement"

# Ops whose values come from Python: Lode's workers cannot run them.
_PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"}
# Random ops whose seeds are attributes: unseeded (both 0), each run draws anew.
_SEEDED_BY_ATTR = {
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial",
    "RandomCrop", "ParameterizedTruncatedNormal",
}
# Shuffle ops: input positions of (seed, seed2, generator).
_SHUFFLES = {
    "ShuffleDataset": (2, 3, None),
    "ShuffleDatasetV3": (2, 3, 4),
    "ShuffleAndRepeatDataset": (2, 3, None),
    "ShuffleAndRepeatDatasetV2": (2, 3, 5),
}

_datasets = {}  # id(dataset) -> (dataset, its stand-in or None)


def _hook():
    from lode import _hook

    return _hook


def _const_value(node):
    import tensorflow as tf

    return tf.make_ndarray(node.attr["value"].tensor)


def _why_not(dataset, graph):
    """Why Lode cannot serve the dataset whose serialized graph is `graph` (None: it can)."""
    import tensorflow as tf

    if tf.distribute.has_strategy():
        name = type(tf.distribute.get_strategy()).__name__
        return f"the dataset is iterated under a distribution strategy ({name}) other than the default"
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, tf.TensorSpec):
            return f"its elements hold a {type(spec).__name__} (Lode serves dense tensors only)"
    nodes = list(graph.node)
    for f in graph.library.function:
        nodes.extend(f.node_def)
    by_name = {n.name: n for n in graph.node}
    for n in nodes:
        if n.op == "GeneratorDataset":
            return f"its source is Python (from_generator: {n.op} {n.name})"
    for n in nodes:
        if n.op in _PYTHON_OPS:
            return f"its pipeline runs Python (py_function/numpy_function: {n.op} {n.name})"
        if n.op in _SEEDED_BY_ATTR and n.attr["seed"].i == 0 and n.attr["seed2"].i == 0:
            return f"its pipeline has an unseeded random op ({n.op} {n.name}): each run draws anew"
    for n in graph.node:
        positions = _SHUFFLES.get(n.op)
        if positions is None:
            continue
        seeds = [by_name.get(n.input[k].split(":")[0]) for k in positions[:2]]
        if all(s is not None and s.op == "Const" for s in seeds) and all(
            int(_const_value(s)) == 0 for s in seeds
        ):
            return f"its shuffle ({n.name}) has no seed: each run shuffles anew"
    return None


def _node(graph, name, op, inputs=(), **attrs):
    node = graph.node.add()
    node.name, node.op = name, op
    node.input.extend(inputs)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def _cuttable(serialized):
    """The dataset's graph in the form the decoupler cuts: the `_Retval` replaced by an
    iterator over the final dataset, an `IteratorGetNext`, and one Identity per component
    under a control edge from an anchor variable (so that the components are read on the
    training side); a shuffle whose seed generator is serialized as a resource constant
    becomes the first version's shuffle of the same seeds. Returns (graph, component count)."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2, types_pb2

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized)
    ret = [n for n in graph.node if n.op == "_Retval" and n.name == "dataset"]
    if len(ret) != 1:
        raise ValueError("the serialized dataset has no `_Retval` named `dataset`")
    final = ret[0].input[0]
    kept = [n for n in graph.node if n is not ret[0]]
    del graph.node[:]
    graph.node.extend(kept)
    by_name = {n.name: n for n in graph.node}
    for n in graph.node:
        positions = _SHUFFLES.get(n.op)
        if positions is None or positions[2] is None or len(n.input) <= positions[2]:
            continue
        gen = by_name.get(n.input[positions[2]].split(":")[0])
        if gen is None or gen.op != "Const" or gen.attr["dtype"].type != types_pb2.DT_RESOURCE:
            continue
        # The seed generator of an eager dataset is serialized as a resource constant. The
        # shuffle of the first version with the same seeds and reshuffling draws the same
        # seeds per iterator (TensorFlow makes it the same RandomSeedGenerator), and is what
        # the decoupler reads.
        n.op = n.op[: -len("V2")] if n.op.endswith("V2") else n.op[: -len("V3")]
        del n.input[positions[2]]
        if "reshuffle_each_iteration" not in n.attr:
            n.attr["reshuffle_each_iteration"].b = True
    final_node = by_name[final.split(":")[0]]
    types = final_node.attr["output_types"]
    shapes = final_node.attr["output_shapes"]
    _node(graph, "lode_tf2/iterator", "IteratorV2",
          shared_name=attr_value_pb2.AttrValue(s=b""),
          container=attr_value_pb2.AttrValue(s=b""),
          output_types=types, output_shapes=shapes)
    _node(graph, "lode_tf2/make_iterator", "MakeIterator", [final, "lode_tf2/iterator"])
    _node(graph, "lode_tf2/get_next", "IteratorGetNext", ["lode_tf2/iterator"],
          output_types=types, output_shapes=shapes)
    _node(graph, "lode_tf2/anchor", "VarHandleOp",
          dtype=attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT),
          shape=attr_value_pb2.AttrValue(shape=tensor_shape_pb2.TensorShapeProto()),
          shared_name=attr_value_pb2.AttrValue(s=b"lode_tf2_anchor"),
          container=attr_value_pb2.AttrValue(s=b""))
    count = len(types.list.type)
    for k, dtype in enumerate(types.list.type):
        _node(graph, f"lode_tf2/out_{k}", "Identity", [f"lode_tf2/get_next:{k}", "^lode_tf2/anchor"],
              T=attr_value_pb2.AttrValue(type=dtype))
    return graph, count


def _receiving(training_path, count, job):
    """The part of the training graph that yields one element: the DWRecv nodes and what they
    feed up to the components (`lode_tf2/out_k`), without the anchor, and before the DWRecv
    nodes a DWSeek of the element's step (the placeholder `lode_tf2/step`); the DWRecv and
    DWSeek nodes serve job `job` of the program."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2, types_pb2

    training = tf.compat.v1.GraphDef()
    with open(training_path, "rb") as f:
        training.ParseFromString(f.read())
    outputs = [f"lode_tf2/out_{k}" for k in range(count)]
    for n in training.node:
        if n.name in outputs:
            kept = [i for i in n.input if not i.startswith("^")]
            del n.input[:]
            n.input.extend(kept)
    receiving = tf.compat.v1.graph_util.extract_sub_graph(training, outputs)
    for n in receiving.node:
        if n.op == "DWRecv":
            n.input.append("^lode_tf2/seek")
            n.attr["job"].i = job
    _node(receiving, "lode_tf2/step", "Placeholder",
          dtype=attr_value_pb2.AttrValue(type=types_pb2.DT_INT64),
          shape=attr_value_pb2.AttrValue(shape=tensor_shape_pb2.TensorShapeProto()))
    _node(receiving, "lode_tf2/seek", "DWSeek", ["lode_tf2/step"], job=attr_value_pb2.AttrValue(i=job))
    return receiving


class _StandIn:
    """The datasets the program iterates in place of its dataset: one per iterator, of the
    original's element_spec and cardinality, whose elements are the job's steps of that
    iterator's pass (one DWRecv run each).

    Each is `source.flat_map(steps of the pass from its first).map(receive)`: `source` yields
    the pass's first step (DWPassBegin, or a constant when the pass began as the iterator was
    created), the flat_map the pass's step numbers, and `receive` runs DWSeek(step) before the
    DWRecv nodes. The position is then the iterator's own state, which TensorFlow's checkpoint
    of the iterator (`tf.train.Checkpoint(iterator=...)`) saves and restores as it does any
    iterator's: the flat_map's input element (the pass's first step) and the range's next
    value. An iterator restored from a checkpoint yields the step after it, and DWSeek moves
    the receiver there; no hook into `Checkpoint` is needed. `job`: the program's job that
    serves the dataset."""

    def __init__(self, dataset, receiving, count, pass_steps, job):
        import tensorflow as tf

        self.job = job
        self.spec = dataset.element_spec
        self.receiving = receiving
        self.names = [f"lode_tf2/out_{k}:0" for k in range(count)]
        self.pass_steps = pass_steps
        self.cardinality = int(dataset.cardinality())
        # The job's pass must be the dataset's length: a known cardinality is asserted on
        # each stand-in (`_over`), which would fail at the pass's end otherwise.
        expected = {tf.data.INFINITE_CARDINALITY: None, tf.data.UNKNOWN_CARDINALITY: pass_steps}
        if expected.get(self.cardinality, self.cardinality) != pass_steps:
            steps = "endless" if pass_steps is None else f"{pass_steps} steps"
            raise ValueError(f"the job's pass is {steps}, the dataset's cardinality {self.cardinality}")

    def _steps(self, first):
        import tensorflow as tf

        if self.pass_steps is None:
            return tf.data.Dataset.counter(first)
        return tf.data.Dataset.range(first, first + self.pass_steps)

    def _receive(self, step):
        import tensorflow as tf

        tensors = tf.graph_util.import_graph_def(
            self.receiving, input_map={"lode_tf2/step:0": step}, return_elements=self.names, name="lode")
        flat = [tf.ensure_shape(t, s.shape) for t, s in zip(tensors, tf.nest.flatten(self.spec))]
        return tf.nest.pack_sequence_as(self.spec, flat)

    def _over(self, source):
        import tensorflow as tf

        stand_in = source.flat_map(self._steps).map(self._receive)
        if self.cardinality != tf.data.UNKNOWN_CARDINALITY:
            stand_in = stand_in.apply(tf.data.experimental.assert_cardinality(self.cardinality))
        options = tf.data.Options()
        # One element is one step, taken when it is asked for: nothing read ahead by an
        # iterator the program may leave (the next iterator is the next pass).
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        options.autotune.enabled = False
        # DWPassBegin, DWSeek and DWRecv are state outside the dataset; what a checkpoint
        # must hold is the iterator's position, which is in the dataset's own state (above).
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        stand_in = stand_in.with_options(options)
        setattr(stand_in, _REPLACED, True)
        return stand_in

    def eager(self):
        """The dataset of an eager iterator created now: its pass begins now, as a
        TensorFlow iterator draws its shuffle's seeds when it is created."""
        import tensorflow as tf

        from lode._native import last_error, native

        first = native().lode_pass_begin(self.job)
        if first < 0:
            raise RuntimeError(f"lode: cannot start the dataset's next pass: {last_error()}")
        return self._over(tf.data.Dataset.from_tensors(tf.constant(first, tf.int64)))

    def in_graph(self):
        """The dataset of an iterator made inside a `tf.function`: its pass begins when it
        yields its first element (DWPassBegin)."""
        import tensorflow as tf

        from lode._native import load_ops

        ops = load_ops()
        return self._over(tf.data.Dataset.range(1).map(lambda _: ops.dw_pass_begin(job=self.job)))


def _serve(dataset):
    """The stand-in to iterate in place of `dataset`, or None to iterate it unchanged."""
    import tensorflow as tf

    from lode._native import check, load_ops, native

    hook = _hook()
    state = hook._state
    strict = os.environ.get(hook._STRICT) == "1"

    def unchanged(why):
        if strict:
            hook._say(f"a tf.data dataset cannot be served ({why}) and lode train runs with --strict")
            sys.stderr.flush()
            os._exit(2)
        hook._say(f"a tf.data dataset is not served ({why}); it runs unchanged")
        return None

    if state["cut"] is not None and not state["datasets"]:
        return unchanged("a second input pipeline after a TF1 session's graph was cut: one job per TF1 program")
    try:
        with tf.init_scope():
            if not tf.executing_eagerly():
                return unchanged("it was made in graph mode; Lode serves TF1 graphs at their session")
            serialized = dataset._as_serialized_graph().numpy()
    except Exception as e:  # noqa: BLE001 - TensorFlow's reasons are many; say which
        return unchanged(f"its graph cannot be serialized: {type(e).__name__}: {e}")
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized)
    why = _why_not(dataset, graph)
    if why is not None:
        return unchanged(why)
    try:
        cuttable, count = _cuttable(serialized)
    except (ValueError, KeyError) as e:
        return unchanged(f"its graph is not a dataset graph: {e}")
    state["requests"] += 1
    workdir = os.environ.get(hook._WORKDIR) or "."
    path = os.path.join(workdir, f"dataset-{os.getpid()}-{state['requests']}.pb")
    with open(path, "wb") as f:
        f.write(cuttable.SerializeToString())
    reply = hook._ask({"graph": path, "cwd": os.getcwd(), "kind": "dataset"})
    if not reply.get("ok"):
        hook._say(reply.get("reason", "the dataset cannot be cut"))
        if reply.get("fatal"):
            sys.stderr.flush()
            os._exit(2)
        return None
    load_ops()
    job = reply["job"]
    # `lode train` numbers a program's jobs as it numbers their dispatchers' job ids: the
    # index is the training side's too.
    index = int(job["job"])
    receiving = _receiving(reply["training"], count, index)
    try:
        stand_in = _StandIn(dataset, receiving, count, None if job.get("endless") else job.get("pass_steps"), index)
    except (ValueError, tf.errors.OpError) as e:
        # The job was started for nothing; the program runs unchanged (or stops, strict).
        return unchanged(f"no stand-in for it: {e}")
    check(native().lode_connect(index, json.dumps(job).encode()), f"cannot connect to job {index}")
    state["connected"] = True
    state["datasets"] += 1
    if state["cut"] is None:
        state["cut"] = dataset
    hook._say(reply.get("message", "training on Lode"))
    return stand_in


def _derived_from_stand_in(dataset):
    """Whether the dataset is, or is made from, a stand-in (AutoGraph's loop wraps the one it
    was given in a scan)."""
    seen, todo = set(), [dataset]
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        if getattr(d, _REPLACED, False):
            return True
        try:
            todo.extend(d._inputs())
        except (AttributeError, NotImplementedError, TypeError):
            pass
    return False


def _stand_in_for(dataset):
    if _derived_from_stand_in(dataset):
        return None
    import tensorflow as tf

    key = id(dataset)
    if key not in _datasets:
        _datasets[key] = (dataset, None)  # iterating it while it is cut iterates it as it is
        with tf.init_scope():  # the stand-in is made eagerly, for every function to capture
            _datasets[key] = (dataset, _serve(dataset))
    return _datasets[key][1]


def patch(module):
    """Patches `DatasetV2.__iter__` and `DatasetV2.reduce` (see the module documentation)."""
    base = module.DatasetV2
    iterate, reduce = base.__iter__, base.reduce

    def lode_iter(self):
        import tensorflow as tf

        if not (tf.executing_eagerly() or tf.inside_function()):
            return iterate(self)
        stand_in = _stand_in_for(self)
        if stand_in is None:
            return iterate(self)
        if tf.executing_eagerly():
            return iterate(stand_in.eager())
        return iterate(stand_in.in_graph())

    def lode_reduce(self, initial_state, reduce_func, name=None):
        import tensorflow as tf

        if not (tf.executing_eagerly() or tf.inside_function()):
            return reduce(self, initial_state, reduce_func, name=name)
        stand_in = _stand_in_for(self)
        if stand_in is None:
            return reduce(self, initial_state, reduce_func, name=name)
        if tf.executing_eagerly():
            return reduce(stand_in.eager(), initial_state, reduce_func, name=name)
        return reduce(stand_in.in_graph(), initial_state, reduce_func, name=name)

    base.__iter__ = lode_iter
    base.reduce = lode_reduce

    # AutoGraph's `for x in dataset` inside a tf.function: its loop (registered for DatasetV2
    # when the module loaded) is given the stand-in.
    from tensorflow.python.autograph.operators import control_flow
    from tensorflow.python.data.ops import dataset_autograph

    loop = dataset_autograph._tf_ag_dataset_for_stmt

    def lode_for_stmt(ds, *args, **kwargs):
        import tensorflow as tf

        if tf.inside_function():
            stand_in = _stand_in_for(ds)
            if stand_in is not None:
                ds = stand_in.in_graph()
        return loop(ds, *args, **kwargs)

    # The registry refuses a second registration of a type: its entry is replaced in place.
    control_flow.for_loop_registry._registry[base] = lode_for_stmt
