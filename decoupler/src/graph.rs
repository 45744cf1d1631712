//! An indexed view of a GraphDef: nodes by position, data and control edges in both
//! directions, and the dtype of every output. Built in one pass over the nodes (names), one
//! over the inputs (edges) and one over the ops (types).

use std::collections::HashMap;

use lode_proto::names::Input;
use lode_proto::ops::OpRegistry;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::types::DataType;

use crate::error::{Error, Result};

/// Position of a node in `GraphDef.node`.
pub type NodeId = usize;

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tensor {
    pub node: NodeId,
    pub output: u32,
}

#[derive(Debug)]
pub struct Graph<'a> {
    pub def: &'a GraphDef,
    pub index: HashMap<&'a str, NodeId>,
    /// Data inputs of each node, in input order.
    pub inputs: Vec<Vec<Tensor>>,
    /// Control inputs of each node.
    pub controls: Vec<Vec<NodeId>>,
    /// Every node that reads a node, through data or control edges (may repeat).
    pub consumers: Vec<Vec<NodeId>>,
    /// Output dtypes of each node.
    pub out_types: Vec<Vec<DataType>>,
    pub library: HashMap<&'a str, &'a FunctionDef>,
}

impl<'a> Graph<'a> {
    pub fn new(def: &'a GraphDef) -> Result<Self> {
        let nodes = &def.node;
        let mut index = HashMap::with_capacity(nodes.len());
        for (id, node) in nodes.iter().enumerate() {
            if index.insert(node.name.as_str(), id).is_some() {
                return Err(Error::InvalidGraph {
                    reason: format!("node name '{}' appears twice", node.name),
                });
            }
        }
        let library: HashMap<&str, &FunctionDef> = def
            .library
            .as_ref()
            .map(|l| {
                l.function
                    .iter()
                    .filter_map(|f| f.signature.as_ref().map(|s| (s.name.as_str(), f)))
                    .collect()
            })
            .unwrap_or_default();
        let mut inputs = vec![Vec::new(); nodes.len()];
        let mut controls = vec![Vec::new(); nodes.len()];
        let mut consumers = vec![Vec::new(); nodes.len()];
        for (id, node) in nodes.iter().enumerate() {
            for raw in &node.input {
                let input = Input::parse(raw).map_err(|e| Error::InvalidGraph {
                    reason: format!("node '{}' ({}): {e}", node.name, node.op),
                })?;
                let &src = index.get(input.node()).ok_or_else(|| Error::InvalidGraph {
                    reason: format!(
                        "node '{}' ({}) reads '{raw}', but no node is named '{}'",
                        node.name,
                        node.op,
                        input.node()
                    ),
                })?;
                match input {
                    Input::Data(t) => inputs[id].push(Tensor {
                        node: src,
                        output: t.index,
                    }),
                    Input::Control(_) => controls[id].push(src),
                }
                consumers[src].push(id);
            }
        }
        let registry = OpRegistry::tensorflow();
        let mut out_types = Vec::with_capacity(nodes.len());
        let mut unknown = Vec::new();
        for node in nodes {
            match registry.output_types(node, &library) {
                Ok(types) => out_types.push(types),
                Err(lode_proto::Error::UnknownOp { node, op }) => {
                    unknown.push(format!("{node} ({op})"));
                    out_types.push(Vec::new());
                }
                Err(source) => return Err(Error::Proto(source)),
            }
        }
        if !unknown.is_empty() {
            return Err(Error::UnknownOps { nodes: unknown });
        }
        let graph = Graph {
            def,
            index,
            inputs,
            controls,
            consumers,
            out_types,
            library,
        };
        graph.check_output_indices()?;
        Ok(graph)
    }

    fn check_output_indices(&self) -> Result<()> {
        for (id, inputs) in self.inputs.iter().enumerate() {
            for t in inputs {
                if usize::try_from(t.output).map_or(true, |o| o >= self.out_types[t.node].len()) {
                    return Err(Error::InvalidGraph {
                        reason: format!(
                            "node '{}' reads output {} of '{}' ({}), which has {} outputs",
                            self.node(id).name,
                            t.output,
                            self.node(t.node).name,
                            self.node(t.node).op,
                            self.out_types[t.node].len()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.def.node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.def.node.is_empty()
    }

    pub fn node(&self, id: NodeId) -> &'a NodeDef {
        &self.def.node[id]
    }

    pub fn dtype(&self, t: Tensor) -> DataType {
        usize::try_from(t.output)
            .ok()
            .and_then(|o| self.out_types[t.node].get(o).copied())
            .unwrap_or(DataType::DT_INVALID)
    }

    /// `node:idx` of a tensor.
    pub fn tensor_name(&self, t: Tensor) -> String {
        format!("{}:{}", self.node(t.node).name, t.output)
    }

    /// Nodes in an order where every node comes after its inputs; back edges of TF1 loops
    /// (inputs from NextIteration) are ignored so loops do not block the order.
    pub fn topological_order(&self) -> Vec<NodeId> {
        let n = self.len();
        let mut pending = vec![0usize; n];
        let mut forward: Vec<Vec<NodeId>> = vec![Vec::new(); n];
        for (id, waiting) in pending.iter_mut().enumerate() {
            let sources = self.inputs[id]
                .iter()
                .map(|t| t.node)
                .chain(self.controls[id].iter().copied());
            for src in sources {
                if self.node(src).op == "NextIteration" {
                    continue;
                }
                *waiting += 1;
                forward[src].push(id);
            }
        }
        let mut ready: Vec<NodeId> = (0..n).rev().filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(id) = ready.pop() {
            order.push(id);
            for &next in forward[id].iter().rev() {
                pending[next] -= 1;
                if pending[next] == 0 {
                    ready.push(next);
                }
            }
        }
        // Whatever is left sits on a cycle that no NextIteration explains; keep input order.
        if order.len() < n {
            let mut seen = vec![false; n];
            for &id in &order {
                seen[id] = true;
            }
            order.extend((0..n).filter(|&i| !seen[i]));
        }
        order
    }
}
