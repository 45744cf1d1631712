"""The session hook of `lode train`: an unmodified TF1-style program trains on Lode.

`lode train` starts the program with a `sitecustomize` that calls `install()`. When TensorFlow's
session module loads, `BaseSession` is patched (the approach of Alibaba's EasyParallelLibrary:
Python-level, so it sees the whole graph once, before any run, rather than each run's pruned
subgraph as a graph optimization pass would):

- Creating a session on a graph with variables and an input pipeline exports the graph and asks
  `lode train` (over its Unix socket) to cut it; `lode train` partitions it, starts the job's
  dispatcher and data workers, and answers with the training graph. The session is then created
  on that graph instead, and the process connects to the job (one receiver per process).
- `run` and `make_callable` translate what the program fetches and feeds (tensors, operations,
  variables, nested structures) into the training graph's elements of the same names, and tell
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

_state = {"connected": False, "cut": None, "replacements": {}, "said": set(), "requests": 0}


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
        return "the graph has no tf.data input pipeline (no IteratorGetNext)", True
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
        _say("a second graph with an input pipeline is not cut (one job per process); it runs unchanged")
        return None
    import tensorflow as tf

    _state["requests"] += 1
    workdir = os.environ.get(_WORKDIR) or "."
    path = os.path.join(workdir, f"graph-{os.getpid()}-{_state['requests']}.pb")
    with open(path, "wb") as f:
        f.write(source.as_graph_def(add_shapes=True).SerializeToString())
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
    replacement = tf.Graph()
    replacement.seed = source.seed
    with replacement.as_default():
        tf.graph_util.import_graph_def(training, name="")
    check(native().lode_connect(json.dumps(reply["job"]).encode()), "cannot connect to the job")
    _state["connected"] = True
    _state["cut"] = source
    _state["known"] = len(source.get_operations())
    cache[source] = replacement
    _say(reply.get("message", "training on Lode"))
    return replacement


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
        """The training graph's element of the program's `name` (an op added after the cut is
        under the name scope it was imported in)."""
        op, _, index = name.partition(":")
        op = _state.get("renamed", {}).get(op, op)
        return self.target.as_graph_element(f"{op}:{index}" if index else op)

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
    They read training-side names; one that reads data-side work cannot be added."""
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

    added = {op.name for op in ops[known:]}
    graph_def = source.as_graph_def(add_shapes=True)
    extension = tf.compat.v1.GraphDef()
    extension.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name in added:
            extension.node.add().CopyFrom(node)
    renamed = _state.setdefault("renamed", {})
    prefix = f"lode_late_{len(renamed)}"
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
                    controls.setdefault(node.name, []).append(
                        target.get_operation_by_name(renamed.get(base, base)))
                else:
                    key = name if ":" in name else name + ":0"
                    op, index = key.rsplit(":", 1)
                    existing[key] = target.get_tensor_by_name(f"{renamed.get(op, op)}:{index}")
                    kept.append(name)
            del node.input[:]
            node.input.extend(kept)
        with target.as_default():
            tf.graph_util.import_graph_def(extension, input_map=existing, name=prefix)
        for name, ops_before in controls.items():
            target.get_operation_by_name(f"{prefix}/{name}")._add_control_inputs(ops_before)
    except (ValueError, KeyError) as e:
        raise RuntimeError(
            f"lode: ops added to the graph after its session was created read data-side work "
            f"that is no longer in the training graph: {e}"
        ) from None
    for name in added:
        renamed[name] = f"{prefix}/{name}"
    _state["known"] = len(ops)
    _state["version"] = source.version


def _patch_session(module):
    base = module.BaseSession
    init, run, make_callable = base.__init__, base.run, base.make_callable

    def __init__(self, target="", graph=None, config=None):
        from tensorflow.python.framework import ops

        source = graph if graph is not None else ops.get_default_graph()
        replacement = _replacement(source)
        if replacement is None:
            return init(self, target, graph, config)
        init(self, target, replacement, config)
        self._lode_source = source
        self._lode_translator = _Translator(source, replacement)
        self._lode_callables = _Callables(self, self._lode_translator, make_callable)
        self._lode_finished = native().lode_run_finished

    def lode_run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        source = getattr(self, "_lode_source", None)
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

    def lode_make_callable(self, fetches, feed_list=None, accept_options=False):
        source = getattr(self, "_lode_source", None)
        if source is None:
            return make_callable(self, fetches, feed_list, accept_options)
        _extend(source, self.graph)
        t = self._lode_translator
        call = make_callable(self, t(fetches), t(feed_list), accept_options)
        finished = self._lode_finished

        def call_and_finish(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            finally:
                finished()

        return call_and_finish

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


def _sidecar(prefix):
    return f"{prefix}.lode.json"


def _patch_saver(module):
    saver = module.Saver
    save, restore = saver.save, saver.restore

    def lode_save(self, sess, save_path, *args, **kwargs):
        path = save(self, sess, save_path, *args, **kwargs)
        if path and _state["connected"]:
            position = native().lode_position()
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
            check(native().lode_resume(position), f"cannot resume from {save_path}")
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
