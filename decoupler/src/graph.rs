//! An indexed view of a GraphDef: nodes by position, data and control edges in both
//! directions, and the dtype of every output. Built in one pass over the nodes (names), one
//! over the inputs (edges) and one over the ops (types).

use std::collections::HashMap;

use lode_proto::names::Input;
use lode_proto::ops::OpRegistry;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::types::DataType;
use lode_proto::view::{GraphView, NodeView};
use rustc_hash::FxHashMap;

use crate::error::{Error, Result};

/// Position of a node in `GraphDef.node`.
pub type NodeId = usize;

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tensor {
    pub node: NodeId,
    pub output: u32,
}

/// Per-node lists in one flat array (compressed sparse rows): `rows[id]` is node `id`'s slice.
/// One allocation instead of one per node keeps million-node graphs cheap.
#[derive(Debug, Clone, Default)]
pub struct Rows<T> {
    offsets: Vec<usize>,
    items: Vec<T>,
}

impl<T> Rows<T> {
    fn with_capacity(rows: usize, items: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Rows {
            offsets,
            items: Vec::with_capacity(items),
        }
    }

    fn push(&mut self, item: T) {
        self.items.push(item);
    }

    /// Closes the current row.
    fn end_row(&mut self) {
        self.offsets.push(self.items.len());
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> std::ops::Index<usize> for Rows<T> {
    type Output = [T];

    fn index(&self, row: usize) -> &[T] {
        &self.items[self.offsets[row]..self.offsets[row + 1]]
    }
}

#[derive(Debug)]
pub struct Graph<'a> {
    pub def: &'a GraphView<'a>,
    pub index: FxHashMap<&'a str, NodeId>,
    /// Data inputs of each node, in input order.
    pub inputs: Rows<Tensor>,
    /// Control inputs of each node.
    pub controls: Rows<NodeId>,
    /// Every node that reads a node, through data or control edges (may repeat).
    pub consumers: Rows<NodeId>,
    /// Output dtypes of each node.
    pub out_types: Rows<DataType>,
    pub library: HashMap<&'a str, &'a FunctionDef>,
}

impl<'a> Graph<'a> {
    pub fn new(def: &'a GraphView<'a>) -> Result<Self> {
        let nodes = &def.nodes;
        let mut index = FxHashMap::with_capacity_and_hasher(nodes.len(), Default::default());
        for (id, node) in nodes.iter().enumerate() {
            if node.name.is_empty() || node.op.is_empty() {
                return Err(Error::InvalidGraph {
                    reason: format!("node #{id} ('{}') has no name or no op", node.name),
                });
            }
            if index.insert(node.name, id).is_some() {
                return Err(Error::InvalidGraph {
                    reason: format!("node name '{}' appears twice", node.name),
                });
            }
        }
        let library = lode_proto::ops::function_index(def.library.as_ref());
        let edges: usize = nodes.iter().map(|n| n.inputs.len()).sum();
        let mut inputs = Rows::with_capacity(nodes.len(), edges);
        let mut controls = Rows::with_capacity(nodes.len(), 0);
        let mut sources: Vec<NodeId> = Vec::with_capacity(edges);
        for node in nodes {
            for raw in &node.inputs {
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
                    Input::Data(t) => inputs.push(Tensor {
                        node: src,
                        output: t.index,
                    }),
                    Input::Control(_) => controls.push(src),
                }
                sources.push(src);
            }
            inputs.end_row();
            controls.end_row();
        }
        // Consumers: count per source, then fill (a transpose of the edge list).
        let mut counts = vec![0usize; nodes.len() + 1];
        for &src in &sources {
            counts[src + 1] += 1;
        }
        for i in 1..counts.len() {
            counts[i] += counts[i - 1];
        }
        let mut fill = counts.clone();
        let mut flat = vec![0; sources.len()];
        let mut k = 0;
        for (id, node) in nodes.iter().enumerate() {
            for _ in 0..node.inputs.len() {
                let src = sources[k];
                flat[fill[src]] = id;
                fill[src] += 1;
                k += 1;
            }
        }
        let consumers = Rows {
            offsets: counts,
            items: flat,
        };
        let registry = OpRegistry::tensorflow();
        let mut out_types = Rows::with_capacity(nodes.len(), nodes.len());
        let mut unknown = Vec::new();
        for node in nodes {
            match registry.output_types(node, &library) {
                Ok(types) => types.into_iter().for_each(|t| out_types.push(t)),
                Err(lode_proto::Error::UnknownOp { node, op }) => {
                    unknown.push(format!("{node} ({op})"));
                }
                Err(source) => return Err(Error::Proto(source)),
            }
            out_types.end_row();
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
        for id in 0..self.len() {
            for t in &self.inputs[id] {
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
        self.def.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.def.nodes.is_empty()
    }

    pub fn node(&self, id: NodeId) -> &'a NodeView<'a> {
        &self.def.nodes[id]
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
