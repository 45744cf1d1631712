//! A list of nodes compiled into something that runs: every node needed for the outputs, in
//! topological order, with a kernel built from its attributes, outputs in numbered slots, and
//! every node whose inputs are all constant evaluated once at load (constant folding).
//!
//! Node inputs come in two spellings: graph style (`node`, `node:2`) and function-body style
//! (`node:output_arg:2`, or an argument's name). Both are normalized to (node, flat output).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use lode_proto::attr::NodeAttrs;
use lode_proto::ops::OpRegistry;
use lode_proto::tf::attr_value::attr_value::Value as AttrValueKind;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::node_def::NodeDef;
use rayon::prelude::*;

use super::ops;
use super::value::{TableCell, Value};
use super::{ExecError, Failure, Result};

/// A kernel ready to run: inputs in, outputs out.
pub type KernelFn =
    Arc<dyn Fn(&[&Value]) -> std::result::Result<Vec<Value>, Failure> + Send + Sync>;

/// What building a node gives.
pub struct Built {
    pub kernel: KernelFn,
    pub outputs: usize,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("outputs", &self.outputs)
            .finish()
    }
}

/// What kernels need at build time besides their node.
#[derive(Debug)]
pub struct BuildCtx<'a> {
    pub library: &'a HashMap<&'a str, &'a FunctionDef>,
    /// Relative file names (vocabularies) resolve against this.
    pub data_root: &'a Path,
    /// Lookup tables by shared name (or node name when unshared), created once per stage.
    pub tables: &'a Mutex<HashMap<String, Arc<TableCell>>>,
}

/// Where a node's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ref {
    /// Output `1` of node `0` (an index into the body).
    Node(usize, usize),
    /// Argument slot.
    Arg(usize),
}

struct Node {
    name: String,
    op: String,
    kernel: KernelFn,
    inputs: Vec<usize>,
    out_base: usize,
    outputs: usize,
}

/// A compiled node list.
pub struct Program {
    nodes: Vec<Node>,
    /// Ranges of `nodes` whose members do not depend on each other.
    levels: Vec<Range<usize>>,
    /// Every slot, constants filled in.
    template: Vec<Option<Value>>,
    args: usize,
    outputs: Vec<usize>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("nodes", &self.nodes.len())
            .field("levels", &self.levels.len())
            .field("args", &self.args)
            .field("outputs", &self.outputs.len())
            .finish()
    }
}

/// How a node list names its inputs and arguments.
#[derive(Debug)]
pub enum Naming<'a> {
    /// A GraphDef: `node[:idx]`; `externals` maps a node name to the first argument slot of
    /// its outputs (IteratorGetNext, DWRecv), which are then not compiled.
    Graph {
        externals: &'a HashMap<String, usize>,
    },
    /// A function body: `node:out_arg:idx` or `arg`; `args` are the argument names in order.
    Function { args: &'a [String] },
}

/// A compile request.
#[derive(Debug)]
pub struct Compile<'a> {
    pub nodes: &'a [NodeDef],
    pub naming: Naming<'a>,
    /// How many argument slots there are.
    pub args: usize,
    /// The outputs, spelled as inputs are.
    pub roots: &'a [String],
    /// TensorFlow runs grappler's rewrites on these nodes (a session's graph and the functions
    /// it calls), so their `x / c` is `x * (1 / c)`; a tf.data function's body runs as
    /// written (its divisions are exact).
    pub grappler: bool,
}

/// The flat output index of output arg `arg`'s element `idx` of `node` (function-body
/// naming), from the op's signature (or the called function's).
fn output_offset(
    node: &NodeDef,
    arg: &str,
    idx: usize,
    library: &HashMap<&str, &FunctionDef>,
) -> Option<usize> {
    let registry = OpRegistry::tensorflow();
    let signature = match registry.get(&node.op) {
        Some(op) => op,
        None => library.get(node.op.as_str())?.signature.as_ref()?,
    };
    let mut offset = 0usize;
    for out in &signature.output_arg {
        let count = if !out.number_attr.is_empty() {
            usize::try_from(node.attr_int(&out.number_attr).ok()?).ok()?
        } else if !out.type_list_attr.is_empty() {
            match &node.attr.get(&out.type_list_attr)?.value {
                Some(AttrValueKind::List(l)) => l.type_.len(),
                _ => return None,
            }
        } else {
            1
        };
        if out.name == arg {
            return (idx < count).then_some(offset + idx);
        }
        offset += count;
    }
    None
}

impl Program {
    /// Compiles the nodes needed for `request.roots`. Every op without a kernel is collected
    /// into one [`ExecError::MissingKernels`].
    pub fn compile(request: &Compile<'_>, ctx: &BuildCtx<'_>) -> Result<Program> {
        let nodes = request.nodes;
        let by_name: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let graph_err = |node: &str, reason: String| ExecError::Graph {
            node: node.to_owned(),
            reason,
        };
        // Resolves one input spelling.
        let resolve = |from: &str, input: &str| -> Result<Ref> {
            let parts: Vec<&str> = input.split(':').collect();
            let bad = || graph_err(from, format!("input {input:?} names nothing in the graph"));
            let parse_idx = |s: &str| s.parse::<usize>().map_err(|_| bad());
            match &request.naming {
                Naming::Graph { externals } => {
                    let (name, idx) = match parts.as_slice() {
                        [n] => (*n, 0),
                        [n, i] => (*n, parse_idx(i)?),
                        _ => return Err(bad()),
                    };
                    if let Some(&base) = externals.get(name) {
                        return Ok(Ref::Arg(base + idx));
                    }
                    let &node = by_name.get(name).ok_or_else(bad)?;
                    Ok(Ref::Node(node, idx))
                }
                Naming::Function { args } => match parts.as_slice() {
                    [n] | [n, "0"] if args.iter().any(|a| a == n) => Ok(Ref::Arg(
                        args.iter().position(|a| a == n).unwrap_or_default(),
                    )),
                    [n, arg, i] => {
                        let &node = by_name.get(n).ok_or_else(bad)?;
                        let idx = parse_idx(i)?;
                        let flat =
                            output_offset(&nodes[node], arg, idx, ctx.library).ok_or_else(bad)?;
                        Ok(Ref::Node(node, flat))
                    }
                    [n] => {
                        let &node = by_name.get(n).ok_or_else(bad)?;
                        Ok(Ref::Node(node, 0))
                    }
                    _ => Err(bad()),
                },
            }
        };
        let data_inputs = |i: usize| -> Result<Vec<Ref>> {
            nodes[i]
                .input
                .iter()
                .filter(|s| !s.starts_with('^'))
                .map(|s| resolve(&nodes[i].name, s))
                .collect()
        };
        let roots: Vec<Ref> = request
            .roots
            .iter()
            .map(|r| resolve("(outputs)", r))
            .collect::<Result<_>>()?;

        // Nodes whose outputs are fetched (grappler preserves those as they are).
        let root_nodes: std::collections::HashSet<usize> = roots
            .iter()
            .filter_map(|r| match *r {
                Ref::Node(n, _) => Some(n),
                Ref::Arg(_) => None,
            })
            .collect();
        // Topological order of the needed nodes (iterative depth-first search).
        let mut inputs_of: HashMap<usize, Vec<Ref>> = HashMap::new();
        let mut state = vec![0u8; nodes.len()]; // 0 new, 1 open, 2 done
        let mut order = Vec::new();
        for root in &roots {
            let Ref::Node(start, _) = *root else { continue };
            if state[start] == 2 {
                continue;
            }
            let mut stack = vec![(start, false)];
            while let Some((i, expanded)) = stack.pop() {
                if expanded {
                    state[i] = 2;
                    order.push(i);
                    continue;
                }
                match state[i] {
                    2 => continue,
                    1 => {
                        return Err(graph_err(
                            &nodes[i].name,
                            "the node is part of a cycle".into(),
                        ))
                    }
                    _ => {}
                }
                state[i] = 1;
                stack.push((i, true));
                let ins = data_inputs(i)?;
                for r in &ins {
                    if let Ref::Node(j, _) = *r {
                        match state[j] {
                            0 => stack.push((j, false)),
                            1 => {
                                return Err(graph_err(
                                    &nodes[j].name,
                                    "the node is part of a cycle".into(),
                                ))
                            }
                            _ => {}
                        }
                    }
                }
                inputs_of.insert(i, ins);
            }
        }

        // Build kernels, assign slots, fold constants.
        let mut template: Vec<Option<Value>> = vec![None; request.args];
        let mut slot_of: HashMap<usize, (usize, usize)> = HashMap::new(); // node → (base, n)
        let mut missing: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut compiled = Vec::new();
        let mut level_of_slot: Vec<usize> = vec![0; request.args];
        let mut levels_of_nodes = Vec::new();
        for &i in &order {
            let node = &nodes[i];
            let built = match ops::build(node, ctx)? {
                Some(b) => b,
                None => {
                    missing
                        .entry(node.op.clone())
                        .or_default()
                        .push(node.name.clone());
                    continue;
                }
            };
            if !missing.is_empty() {
                // Keep collecting missing ops, but compile nothing more.
                continue;
            }
            let mut inputs = Vec::new();
            for r in inputs_of.get(&i).map_or(&[][..], Vec::as_slice) {
                let slot = match *r {
                    Ref::Arg(a) => {
                        if a >= request.args {
                            return Err(graph_err(
                                &node.name,
                                format!("argument {a} does not exist"),
                            ));
                        }
                        a
                    }
                    Ref::Node(j, k) => {
                        let &(base, n) = slot_of.get(&j).ok_or_else(|| {
                            graph_err(&node.name, "an input was not compiled".into())
                        })?;
                        if k >= n {
                            return Err(graph_err(
                                &node.name,
                                format!("input {}:{k} does not exist ({n} outputs)", nodes[j].name),
                            ));
                        }
                        base + k
                    }
                };
                inputs.push(slot);
            }
            let mut built = built;
            if request.grappler
                && node.op == "RealDiv"
                && !root_nodes.contains(&i)
                && inputs.len() == 2
                && template[inputs[0]].is_none()
            {
                if let Some(Value::Tensor(c)) = &template[inputs[1]] {
                    if let Some(kernel) = ops::real_div_by_constant(c) {
                        built.kernel = kernel;
                    }
                }
            }
            let out_base = template.len();
            template.extend(std::iter::repeat_n(None, built.outputs));
            slot_of.insert(i, (out_base, built.outputs));
            if inputs.iter().all(|&s| template[s].is_some()) {
                // Constant: evaluate now.
                let args: Vec<&Value> = inputs
                    .iter()
                    .filter_map(|&s| template[s].as_ref())
                    .collect();
                let outs = (built.kernel)(&args).map_err(|source| ExecError::Kernel {
                    node: node.name.clone(),
                    op: node.op.clone(),
                    source: Box::new(source),
                })?;
                check_outputs(node, &outs, built.outputs)?;
                for (k, v) in outs.into_iter().enumerate() {
                    template[out_base + k] = Some(v);
                }
                level_of_slot.extend(std::iter::repeat_n(0, built.outputs));
                continue;
            }
            let level = 1 + inputs
                .iter()
                .filter(|&&s| template[s].is_none())
                .map(|&s| level_of_slot[s])
                .max()
                .unwrap_or(0);
            level_of_slot.extend(std::iter::repeat_n(level, built.outputs));
            levels_of_nodes.push(level);
            compiled.push(Node {
                name: node.name.clone(),
                op: node.op.clone(),
                kernel: built.kernel,
                inputs,
                out_base,
                outputs: built.outputs,
            });
        }
        if !missing.is_empty() {
            return Err(ExecError::MissingKernels { missing });
        }
        let mut outputs = Vec::new();
        for (spelled, r) in request.roots.iter().zip(&roots) {
            outputs.push(match *r {
                Ref::Arg(a) if a < request.args => a,
                Ref::Arg(_) => {
                    return Err(graph_err(
                        spelled,
                        "names an argument that does not exist".into(),
                    ))
                }
                Ref::Node(j, k) => {
                    let &(base, n) = slot_of
                        .get(&j)
                        .ok_or_else(|| graph_err(spelled, "was not compiled".into()))?;
                    if k >= n {
                        return Err(graph_err(spelled, format!("the node has {n} outputs")));
                    }
                    base + k
                }
            });
        }
        // Group by level (stable, so topological order holds within and across levels).
        let mut indexed: Vec<(usize, Node)> = levels_of_nodes.into_iter().zip(compiled).collect();
        indexed.sort_by_key(|(l, _)| *l);
        let mut levels = Vec::new();
        let mut start = 0;
        for k in 1..=indexed.len() {
            if k == indexed.len() || indexed[k].0 != indexed[start].0 {
                levels.push(start..k);
                start = k;
            }
        }
        Ok(Program {
            nodes: indexed.into_iter().map(|(_, n)| n).collect(),
            levels,
            template,
            args: request.args,
            outputs,
        })
    }

    /// How many nodes run per call (constants excluded).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Runs the program on its arguments. With `parallel`, the nodes of a level run on the
    /// current rayon pool.
    pub fn run(&self, args: Vec<Value>, parallel: bool) -> Result<Vec<Value>> {
        if args.len() != self.args {
            return Err(ExecError::Input {
                reason: format!("{} arguments given, {} expected", args.len(), self.args),
            });
        }
        let mut env = self.template.clone();
        for (slot, v) in env.iter_mut().zip(args) {
            *slot = Some(v);
        }
        for level in &self.levels {
            let nodes = &self.nodes[level.clone()];
            if parallel && nodes.len() > 1 {
                let results: Vec<Result<Vec<Value>>> =
                    nodes.par_iter().map(|n| run_node(n, &env)).collect();
                for (n, outs) in nodes.iter().zip(results) {
                    store(&mut env, n, outs?);
                }
            } else {
                for n in nodes {
                    let outs = run_node(n, &env)?;
                    store(&mut env, n, outs);
                }
            }
        }
        self.outputs
            .iter()
            .map(|&s| {
                env[s].clone().ok_or_else(|| ExecError::Input {
                    reason: "an output was not computed".into(),
                })
            })
            .collect()
    }
}

fn check_outputs(node: &NodeDef, outs: &[Value], expected: usize) -> Result<()> {
    if outs.len() == expected {
        Ok(())
    } else {
        Err(ExecError::Graph {
            node: node.name.clone(),
            reason: format!(
                "the kernel gave {} outputs, {expected} expected",
                outs.len()
            ),
        })
    }
}

fn run_node(n: &Node, env: &[Option<Value>]) -> Result<Vec<Value>> {
    let mut args = Vec::with_capacity(n.inputs.len());
    for &s in &n.inputs {
        args.push(env[s].as_ref().ok_or_else(|| ExecError::Graph {
            node: n.name.clone(),
            reason: "an input was not computed before the node".into(),
        })?);
    }
    let outs = (n.kernel)(&args).map_err(|source| ExecError::Kernel {
        node: n.name.clone(),
        op: n.op.clone(),
        source: Box::new(source),
    })?;
    if outs.len() != n.outputs {
        return Err(ExecError::Graph {
            node: n.name.clone(),
            reason: format!(
                "the kernel gave {} outputs, {} expected",
                outs.len(),
                n.outputs
            ),
        });
    }
    Ok(outs)
}

fn store(env: &mut [Option<Value>], n: &Node, outs: Vec<Value>) {
    for (k, v) in outs.into_iter().enumerate() {
        env[n.out_base + k] = Some(v);
    }
}
