//! The decoupler's errors: each says what is wrong, with which nodes, and why.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the graph has no model state: no VariableV2, Variable or VarHandleOp node (name other state ops with --stateful-op)")]
    NoState,
    #[error("the graph has no input pipeline outside the training region: no dataset, iterator or reader op (a feed_dict program has nothing to move to data workers)")]
    NoPipeline,
    #[error("cannot place {}: {reason}", nodes.join(", "))]
    Unplaceable { nodes: Vec<String>, reason: String },
    #[error("{} node(s) use ops that TensorFlow 2.18 does not register and the function library does not define: {}", nodes.len(), nodes.iter().take(10).cloned().collect::<Vec<_>>().join(", "))]
    UnknownOps { nodes: Vec<String> },
    #[error("the input pipeline's order cannot be reproduced on indices: {node} ({op}): {reason}")]
    UnsupportedPipeline {
        node: String,
        op: String,
        reason: String,
    },
    #[error("one-shot iterator '{iterator}' (dataset_factory '{function}'): {reason}")]
    OneShotFactory {
        iterator: String,
        function: String,
        reason: String,
    },
    #[error("invalid graph: {reason}")]
    InvalidGraph { reason: String },
    #[error(transparent)]
    Proto(#[from] lode_proto::Error),
    #[error("{}: {reason}", path.display())]
    Output { path: PathBuf, reason: String },
    #[error("{}: cannot partition: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
