"""The session hook of `lode train`: an unmodified TF1-style program trains on Lode.

`lode train` starts the program with a `sitecustomize` that calls `install()`. When TensorFlow's
session module loads, `BaseSession` is patched (the approach of Alibaba's EasyParallelLibrary:
Python-level, so it sees the whole graph once, before any run, rather than each run's pruned
subgraph as a graph optimization pass would):

- Creating a session on a graph with variables and an input pipeline exports the graph and asks
  `lode train` (over its Unix socket) to cut it; `lode train` partitions it, starts the job's
  dispatcher and data workers, and answers with the training graph. The session is then created
  on that graph instead, and the process connects to the job (`_FIRST_JOB`: a TF1 program has
  one job; a TF2 program's datasets are one job each, `lode._tf2`).
- A session made on a graph with variables but no pipeline yet (Keras 2 in graph mode: `tf_keras`
  makes its session before `fit` makes the iterator) is watched, and its graph is cut at the
  session's first run after the graph gained a pipeline, in place: the training graph is
  imported into the program's graph under a name scope and the live session runs that copy,
  whose variables are the ones the session already initialized (`_cut_in_place`).
- `run`, `make_callable` and `_make_callable_from_options` (Keras 2's per-step callable)
  translate what the program fetches and feeds (tensors, operations, variables, nested
  structures, names) into the training graph's elements of the same names, and tell
  the training side when a run has finished (its step is then consumed). A run without feeds
  goes through a callable made once per distinct fetch structure (`_Callables`), so that a
  training loop's step costs no per-run translation in TensorFlow's Python either.
- `Saver.save` writes the next step beside the checkpoint (`PREFIX.lode.json`); `Saver.restore`
  reads it back, so a restarted program receives the step after its checkpoint.

A graph Lode cannot cut runs unchanged on its local pipeline, with one line on stderr saying
why (or, under `lode train --strict`, the program stops with status 2). The logic of the cut and
of the steps is Lode's Rust code; this module only moves graphs and names.
"""

import atexit
import functools
import importlib.abc
import json
import os
import socket
import sys

from lode._native import check, load_ops, native

_SOCKET = "LODE_TRAIN_SOCKET"
_WORKDIR = "LODE_TRAIN_DIR"
_STRICT = "LODE_TRAIN_STRICT"

_VARIABLE_OPS = {"VariableV2", "Variable", "VarHandleOp"}
_PIPELINE_OPS = {"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"}

_NO_PIPELINE = "the graph has no tf.data input pipeline (no IteratorGetNext)"

# The job a TF1 session's graph is (the training side's job index: one job per TF1 program).
_FIRST_JOB = 1

# "cut": the first graph or dataset served; "datasets": how many TF2 datasets are served (each
# a job of its own).
_state = {"connected": False, "cut": None, "replacements": {}, "said": set(), "requests": 0, "datasets": 0}


def _say(message):
    if message not in _state["said"]:
        _state["said"].add(message)
        sys.stderr.write(f"lode: {message}\n")
        sys.stderr.flush()


def _ask(request):
    path = os.environ.get(_SOCKET)
    if not path:
        raise RuntimeError(f"lode: {_SOCKET} is not set: run the program under `lode train`")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise RuntimeError("lode: `lode train` closed its socket without an answer")
    return json.loads(data)


def _why_not(graph):
    """Why the graph is not cut (None: it is a candidate), and whether it looks like training
    at all (variables or a pipeline): a helper graph with neither is never an error."""
    types = {op.type for op in graph.get_operations()}
    variables, pipeline = bool(types & _VARIABLE_OPS), bool(types & _PIPELINE_OPS)
    if not variables:
        return "the graph has no variables", pipeline
    if not pipeline:
        return _NO_PIPELINE, True
    return None, True


def _replacement(source):
    """The training graph to run in place of `source`, or None to run it unchanged."""
    cache = _state["replacements"]
    if source in cache:
        return cache[source]
    cache[source] = None
    why, training_like = _why_not(source)
    if why is not None:
        if training_like and os.environ.get(_STRICT) == "1":
            _say(f"the program's graph cannot be cut ({why}) and lode train runs with --strict")
            os._exit(2)
        # Sessions on helper graphs (no variables, no pipeline) are common: say it once.
        _say(f"a session's graph is not cut ({why}); it runs unchanged")
        return None
    if _state["cut"] is not None:
        why = "a second graph with an input pipeline is not cut (one job per TF1 program)"
        if os.environ.get(_STRICT) == "1":
            _say(f"{why} and lode train runs with --strict")
            os._exit(2)
        _say(f"{why}; it runs unchanged")
        return None
    got = _cut(source)
    if got is None:
        return None
    import tensorflow as tf

    training, reply = got
    replacement = tf.Graph()
    replacement.seed = source.seed
    with replacement.as_default():
        tf.graph_util.import_graph_def(training, name="")
    _connect(source, reply)
    _state["known"] = len(source.get_operations())
    cache[source] = replacement
    return replacement


def _cut(source, leave_out=frozenset()):
    """Exports `source` (without the ops named in `leave_out`) and asks `lode train` to cut it:
    (the training GraphDef, with the program's iterator initializers as DWIteratorInit, the
    reply), or None when it runs unchanged (said; a fatal refusal stops the program)."""
    import tensorflow as tf

    _state["requests"] += 1
    workdir = os.environ.get(_WORKDIR) or "."
    path = os.path.join(workdir, f"graph-{os.getpid()}-{_state['requests']}.pb")
    graph_def = source.as_graph_def(add_shapes=True)
    if leave_out:
        kept = [node for node in graph_def.node if node.name not in leave_out]
        del graph_def.node[:]
        graph_def.node.extend(kept)
    with open(path, "wb") as f:
        f.write(graph_def.SerializeToString())
    reply = _ask({"graph": path, "cwd": os.getcwd()})
    if not reply.get("ok"):
        _say(reply.get("reason", "the graph cannot be cut"))
        if reply.get("fatal"):
            sys.stderr.flush()
            os._exit(2)
        return None
    load_ops()
    training = tf.compat.v1.GraphDef()
    with open(reply["training"], "rb") as f:
        training.ParseFromString(f.read())
    inits = set(reply.get("iterator_inits", []))
    for node in training.node:
        if node.name in inits:
            node.op = "DWIteratorInit"
            for key in [k for k in node.attr if not k.startswith("_")]:
                del node.attr[key]
    return training, reply


def _connect(source, reply):
    check(native().lode_connect(_FIRST_JOB, json.dumps(reply["job"]).encode()), "cannot connect to the job")
    _state["connected"] = True
    _state["cut"] = source
    _say(reply.get("message", "training on Lode"))


def _import(graph, graph_def, input_map, name):
    """Imports `graph_def` into `graph` under a fresh name scope from the top level (whatever
    scope the program is in); returns the scope's prefix."""
    import tensorflow as tf

    first = graph_def.node[0].name
    with graph.as_default(), graph.name_scope(None):
        op = tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=[first],
                                            name=name)[0]
    return op.name[: -len(first) - 1]


def _downstream(ops):
    """The names of `ops` and of every op that reads them (data or control), transitively."""
    seen = {op.name for op in ops}
    todo = list(ops)
    while todo:
        op = todo.pop()
        for after in [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs):
            if after.name not in seen:
                seen.add(after.name)
                todo.append(after)
    return seen


def _side_work(source):
    """Ops that read a dataset but lead to none of the graph's iterator reads: what the program
    asked of a dataset before its iterator existed (Keras reads the cardinality of `fit`'s
    datasets), and datasets no iterator reads yet (a validation dataset). They are not the
    pipeline being cut and stay the program's, runnable on its own side. Empty when a kept op
    reads one of them (the graph is then sent whole)."""
    ops = source.get_operations()
    reads = [op for op in ops if op.type in _PIPELINE_OPS]
    iterators = {t.op.name for op in reads for t in op.inputs}
    # The reads, their iterators' initializers, and every op they need.
    roots = reads + [op for op in ops if op.type == "MakeIterator" and op.inputs[1].op.name in iterators]
    needed = {op.name for op in roots}
    todo = list(roots)
    while todo:
        op = todo.pop()
        for before in [t.op for t in op.inputs] + list(op.control_inputs):
            if before.name not in needed:
                needed.add(before.name)
                todo.append(before)
    keep = needed | _downstream(reads)
    side = _downstream([op for op in ops if "Dataset" in op.type]) - keep
    by_name = {op.name: op for op in ops}
    for name in keep:
        op = by_name[name]
        if any(t.op.name in side for t in op.inputs) or any(c.name in side for c in op.control_inputs):
            return frozenset()
    return frozenset(side)


def _cut_in_place(source, initialized):
    """Cuts `source`, a graph whose session was made before it had a pipeline (Keras 2 in
    graph mode: `tf_keras` makes its session, reads the dataset's cardinality and initializes
    the model's variables before `fit` makes the iterator), at the first run after it gained
    one. Returns whether it was cut.

    The live session keeps its state: the training graph is imported into the program's own
    graph under a name scope, and the session runs that copy. Its variables are the ones the
    session already holds (a variable's resource is found by its shared name, which the copy
    keeps: a reference variable without one is given its node's name, the name TensorFlow
    gives it). The program's names map to the copy's; a name of data-side work (downstream of
    the iterator, which Lode's workers now compute) refuses to run rather than read the
    program's local pipeline; what the program asked of a dataset on the side (`_side_work`)
    stays its own. `initialized`: the iterator initializers the program ran before the cut; the
    pass they began is the job's first."""
    cache = _state["replacements"]
    cache[source] = None
    got = _cut(source, _side_work(source))
    if got is None:
        return False
    training, reply = got
    names = {node.name for node in training.node}
    for node in training.node:
        if node.op in ("VariableV2", "Variable") and not node.attr["shared_name"].s:
            node.attr["shared_name"].s = node.name.encode()
    reads = [op for op in source.get_operations() if op.type in _PIPELINE_OPS]
    # The iterators the pipeline's reads come from, and everything downstream of the reads.
    seen = _downstream(reads) | {t.op.name for op in reads for t in op.inputs}
    prefix = _import(source, training, None, "lode_cut")
    _state["renamed"] = {name: f"{prefix}/{name}" for name in names}
    _state["forbidden"] = seen - names
    _state["known"] = len(source.get_operations())
    _state["version"] = source.version
    _connect(source, reply)
    if initialized & set(reply.get("iterator_inits", [])):
        check(native().lode_iterator_init(_FIRST_JOB), "cannot start the job's first pass")
    cache[source] = source
    return True


def _training_op(name):
    """The op of the training side that stands for the program's op `name`."""
    if name in _state.get("forbidden", ()):
        raise KeyError(
            f"lode: {name} is data-side work (its values come from Lode's data workers): it "
            f"cannot run in the training process"
        )
    return _state.get("renamed", {}).get(name, name)


class _Translator:
    """Maps the program's graph elements to the training graph's elements of the same name.

    One per session: each element of the program's graph is looked up once (the lookup by
    name is what costs), later runs that fetch it again find it in `memo`, so that a run's
    translation is a walk of its fetch structure (as `make_callable` does it once)."""

    def __init__(self, source, target):
        import tensorflow as tf

        self.source = source
        self.target = target
        self.tf = tf
        self.elements = (tf.Tensor, tf.Operation)
        # id(element) -> (element, its training-graph element); holding the element keeps
        # its id from being reused by another object.
        self.memo = {}

    def __call__(self, x):
        hit = self.memo.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        if x is None or isinstance(x, (str, bytes)):
            return x
        if isinstance(x, list):
            return [self(v) for v in x]
        if isinstance(x, tuple):
            items = [self(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
        if isinstance(x, dict):
            items = [(k, self(v)) for k, v in x.items()]
            try:
                return type(x)(items)
            except TypeError:
                return dict(items)
        tf = self.tf
        if isinstance(x, tf.SparseTensor):
            return tf.SparseTensor(self(x.indices), self(x.values), self(x.dense_shape))
        if isinstance(x, tf.IndexedSlices):
            return tf.IndexedSlices(self(x.values), self(x.indices), self(x.dense_shape))
        if isinstance(x, self.elements):
            if x.graph is not self.source:
                return x
            y = self.element(x.name)
            self.memo[id(x)] = (x, y)
            return y
        element = getattr(x, "_as_graph_element", None)
        if callable(element):
            el = element()
            if el is not None and getattr(el, "graph", None) is self.source:
                return self.element(el.name)
        return x

    def element(self, name):
        """The training graph's element of the program's `name`."""
        return self.target.as_graph_element(self.name(name))

    @staticmethod
    def name(name):
        """The training graph's name for the program's op or tensor `name` (an op added after
        the cut is under the name scope it was imported in, as is every op of a graph cut in
        place)."""
        op, colon, index = name.partition(":")
        op = _training_op(op)
        return f"{op}{colon}{index}"

    def feeds(self, feed_dict):
        if not feed_dict:
            return feed_dict
        return {self(k): v for k, v in feed_dict.items()}


class _Callables:
    """`session.run` without feeds, once per distinct fetch structure, as a callable of the
    training graph (`make_callable` with options): TensorFlow's per-run Python (the fetch
    handler, the feed checks) then runs once per structure, not once per step. The results are
    the ones `run` returns (the same fetch handler builds them), the errors the same types.

    A structure is keyed by its shape and the ids of its elements; the entry holds the
    elements, so that no other object takes their ids while it lives. At most `LIMIT`
    structures are kept (the oldest goes first); anything but lists, tuples, dicts, tensors
    and operations of the program's graph is not cached (`run` takes it as it is)."""

    LIMIT = 64

    def __init__(self, session, translator, make_callable):
        self.session = session
        self.translator = translator
        self.make_callable = make_callable
        self.entries = {}

    def key(self, x, leaves):
        if isinstance(x, self.translator.elements):
            if x.graph is not self.translator.source:
                return None
            leaves.append(x)
            return id(x)
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            parts = tuple(self.key(v, leaves) for v in x)
            return None if None in parts else (type(x), parts)
        if type(x) is dict:
            parts = tuple((k, self.key(v, leaves)) for k, v in x.items())
            return None if any(p is None for _, p in parts) else (dict, parts)
        return None

    def get(self, fetches):
        """The callable for `fetches`, or None when they are not cached."""
        leaves = []
        key = self.key(fetches, leaves)
        if key is None:
            return None
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.LIMIT:
                del self.entries[next(iter(self.entries))]
            call = self.make_callable(self.session, self.translator(fetches), None, True)
            entry = self.entries[key] = (call, leaves)
        return entry[0]


def _extend(source, target):
    """Ops the program added to its graph after the session was created (an initializer, a
    saver): TensorFlow sends them with the next run, so they go into the training graph too.
    They read training-side names; one that reads data-side work cannot be added. A second
    input pipeline among them is not served (one job per TF1 program)."""
    # The graph's version grows with each op added: a run on an unchanged graph (every run
    # of a training loop) costs no look at its ops.
    if source.version == _state.get("version"):
        return
    ops = source.get_operations()
    known = _state.get("known", len(ops))
    if len(ops) <= known:
        _state["version"] = source.version
        return
    import tensorflow as tf

    second = [op.name for op in ops[known:] if op.type in _PIPELINE_OPS]
    if second:
        why = f"a second input pipeline ({second[0]}) is not served (one job per TF1 program)"
        if os.environ.get(_STRICT) == "1":
            _say(f"{why} and lode train runs with --strict")
            os._exit(2)
        _say(f"{why}; it runs unchanged on its local pipeline")
    added = {op.name for op in ops[known:]}
    graph_def = source.as_graph_def(add_shapes=True)
    extension = tf.compat.v1.GraphDef()
    extension.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name in added:
            extension.node.add().CopyFrom(node)
    for node in extension.node:
        # A colocation with an op outside the extension cannot be imported (nor kept: the op
        # may be data-side work); the training side runs on one device.
        if "_class" in node.attr:
            kept = [c for c in node.attr["_class"].list.s if c.decode().removeprefix("loc:@") in added]
            if kept:
                del node.attr["_class"].list.s[:]
                node.attr["_class"].list.s.extend(kept)
            else:
                del node.attr["_class"]
    try:
        # The added ops read existing ones: map those inputs onto the training graph's. An
        # import that maps operations needs a name scope: the added ops are found under it by
        # their own names (`_Translator`).
        # Control inputs on existing ops cannot be mapped: they are added after the import.
        existing, controls = {}, {}
        for node in extension.node:
            kept = []
            for name in node.input:
                base = name.lstrip("^").split(":")[0]
                if base in added:
                    kept.append(name)
                elif name.startswith("^"):
                    controls.setdefault(node.name, []).append(target.get_operation_by_name(_training_op(base)))
                else:
                    key = name if ":" in name else name + ":0"
                    op, index = key.rsplit(":", 1)
                    existing[key] = target.get_tensor_by_name(f"{_training_op(op)}:{index}")
                    kept.append(name)
            del node.input[:]
            node.input.extend(kept)
        prefix = _import(target, extension, existing, "lode_late")
        for name, ops_before in controls.items():
            target.get_operation_by_name(f"{prefix}/{name}")._add_control_inputs(ops_before)
    except (ValueError, KeyError) as e:
        raise RuntimeError(
            f"lode: ops added to the graph after its session was created read data-side work "
            f"that is no longer in the training graph: {e}"
        ) from None
    renamed = _state.setdefault("renamed", {})
    for name in added:
        renamed[name] = f"{prefix}/{name}"
    # A graph cut in place holds the imported ops too.
    _state["known"] = len(source.get_operations())
    _state["version"] = source.version


def _iterator_inits(x, names):
    """Adds to `names` the iterator initializers (and op names) among fetches or targets `x`."""
    if isinstance(x, (list, tuple)):
        for v in x:
            _iterator_inits(v, names)
    elif isinstance(x, dict):
        for v in x.values():
            _iterator_inits(v, names)
    elif isinstance(x, str):
        names.add(x.lstrip("^").split(":")[0])
    elif getattr(x, "type", None) == "MakeIterator":
        names.add(x.name)


def _patch_session(module):
    base = module.BaseSession
    init, run, make_callable = base.__init__, base.run, base.make_callable
    from_options = base._make_callable_from_options

    def serve(session, source, target):
        session._lode_source = source
        session._lode_translator = _Translator(source, target)
        session._lode_callables = _Callables(session, session._lode_translator, make_callable)
        session._lode_finished = functools.partial(native().lode_run_finished, _FIRST_JOB)

    def __init__(self, target="", graph=None, config=None):
        from tensorflow.python.framework import ops

        source = graph if graph is not None else ops.get_default_graph()
        if _state["cut"] is None and source not in _state["replacements"] and _why_not(source)[0] == _NO_PIPELINE:
            # Keras 2 in graph mode: the pipeline comes after the session; watched (`served`).
            init(self, target, graph, config)
            self._lode_watch = {"graph": source, "version": source.version, "inits": set()}
            return
        replacement = _replacement(source)
        if replacement is None:
            return init(self, target, graph, config)
        if replacement is source:
            # A later session on a graph cut in place runs the imported copy too.
            init(self, target, graph, config)
        else:
            init(self, target, replacement, config)
        serve(self, source, replacement)

    def served(self, fetches):
        """The program's graph when this session runs Lode's training graph, else None. A
        watched session's graph is cut in place at its first run after it gained a pipeline
        (`_cut_in_place`); until then the initializers it runs are noted."""
        source = self.__dict__.get("_lode_source")
        watch = self.__dict__.get("_lode_watch")
        if source is not None or watch is None:
            return source
        graph = watch["graph"]
        if graph.version != watch["version"]:
            watch["version"] = graph.version
            if _state["cut"] is graph and _state["replacements"].get(graph) is graph:
                # Another session on the same graph cut it.
                self._lode_watch = None
                serve(self, graph, graph)
                return graph
            if _state["cut"] is not None:
                self._lode_watch = None
                return None
            if _why_not(graph)[0] is None:
                self._lode_watch = None
                if _cut_in_place(graph, watch["inits"]):
                    serve(self, graph, graph)
                    return graph
                return None
        _iterator_inits(fetches, watch["inits"])
        return None

    def lode_run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        source = served(self, fetches)
        if source is None:
            return run(self, fetches, feed_dict, options, run_metadata)
        _extend(source, self.graph)
        t = self._lode_translator
        try:
            call = None if feed_dict or self._closed else self._lode_callables.get(fetches)
            if call is not None:
                return call(options=options, run_metadata=run_metadata)
            return run(self, t(fetches), t.feeds(feed_dict), options, run_metadata)
        finally:
            self._lode_finished()

    def finishing(self, call):
        finished = self._lode_finished

        def call_and_finish(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            finally:
                finished()

        return call_and_finish

    def lode_make_callable(self, fetches, feed_list=None, accept_options=False):
        source = served(self, fetches)
        if source is None:
            return make_callable(self, fetches, feed_list, accept_options)
        _extend(source, self.graph)
        t = self._lode_translator
        return finishing(self, make_callable(self, t(fetches), t(feed_list), accept_options))

    def lode_from_options(self, callable_options):
        # Keras 2's GraphExecutionFunction runs each step through a callable made from
        # options: its feeds, fetches, targets and tensor connections are names.
        source = served(self, list(callable_options.target))
        if source is None:
            return from_options(self, callable_options)
        _extend(source, self.graph)
        name = self._lode_translator.name
        options = type(callable_options)()
        options.CopyFrom(callable_options)
        for names in (options.feed, options.fetch, options.target):
            mapped = [name(n) for n in names]
            del names[:]
            names.extend(mapped)
        for connection in options.tensor_connection:
            connection.from_tensor = name(connection.from_tensor)
            connection.to_tensor = name(connection.to_tensor)
        return finishing(self, from_options(self, options))

    session = module.Session
    enter = session.__enter__

    def lode_enter(self):
        # `with session:` makes the session's graph the default one; ops the program creates
        # inside (an initializer, a saver) belong in its own graph, whose collections they
        # read, and reach the training graph with the next run (`_extend`).
        source = getattr(self, "_lode_source", None)
        if source is None:
            return enter(self)
        replacement, self._graph = self._graph, source
        try:
            return enter(self)
        finally:
            self._graph = replacement

    base.__init__ = __init__
    session.__enter__ = lode_enter
    base.run = lode_run
    base.make_callable = lode_make_callable
    base._make_callable_from_options = lode_from_options


def _sidecar(prefix):
    return f"{prefix}.lode.json"


def _patch_saver(module):
    saver = module.Saver
    save, restore = saver.save, saver.restore

    def lode_save(self, sess, save_path, *args, **kwargs):
        path = save(self, sess, save_path, *args, **kwargs)
        if path and _state["connected"]:
            position = native().lode_position(_FIRST_JOB)
            if position >= 0:
                tmp = _sidecar(path) + ".tmp"
                with open(tmp, "w") as f:
                    json.dump({"next_step": position}, f)
                os.replace(tmp, _sidecar(path))
        return path

    def lode_restore(self, sess, save_path):
        result = restore(self, sess, save_path)
        if save_path and _state["connected"] and os.path.exists(_sidecar(save_path)):
            with open(_sidecar(save_path)) as f:
                position = int(json.load(f)["next_step"])
            check(native().lode_resume(_FIRST_JOB, position), f"cannot resume from {save_path}")
        return result

    saver.save = lode_save
    saver.restore = lode_restore


def _patch_datasets(module):
    # TensorFlow 2: the program's dataset is replaced where it is iterated (lode._tf2).
    from lode import _tf2

    _tf2.patch(module)


_PATCHES = {
    "tensorflow.python.client.session": _patch_session,
    "tensorflow.python.training.saver": _patch_saver,
    "tensorflow.python.data.ops.dataset_ops": _patch_datasets,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Patches TensorFlow's session and saver modules right after they are executed."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _at_exit():
    if _state["connected"]:
        native().lode_shutdown()
    elif not _state["said"]:
        # Nothing was served and nothing said why: say it once (`lode train --strict` fails).
        _say("the program ended without Lode serving an input pipeline (it created no session on "
             "a graph with a tf.data pipeline and iterated no tf.data dataset); it ran unchanged")


def install():
    """Patches TensorFlow when it is imported (or now, if it already is)."""
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
    atexit.register(_at_exit)
