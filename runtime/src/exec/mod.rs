//! The stage executor: a data-worker stage graph compiled once into a [`Stage`], then run for
//! each step on the records of an index batch.
//!
//! - [`value`]: what flows between nodes: tensors, `DT_VARIANT` tensors of tensors
//!   (`SerializeSparse`), lookup-table handles.
//! - [`program`]: a node list (a stage graph's data part, or a function body) compiled into
//!   slots and kernels in topological order, with load-time constant folding and
//!   level-parallel execution on rayon.
//! - [`ops`]: the kernel for each op, built from the node's attributes at load time.
//! - [`source`]: the records behind a plan's `source` (files indexed once, read by record
//!   number).
//! - [`dataset`]: the `tf.data` chain between `DWSource` and the iterator (map, batch).
//! - [`stage`]: [`Stage::load`] and [`Stage::run_step`].
//!
//! A stage that uses an op with no kernel is refused at load with every such op and the nodes
//! that use it ([`ExecError::MissingKernels`]).

pub mod dataset;
pub mod ops;
pub mod program;
pub mod source;
pub mod stage;
pub mod value;

use std::collections::BTreeMap;

use crate::kernels::parsing::ParseError;
use crate::kernels::KernelError;

pub use stage::{ExecOptions, Stage, StepInput, StepOutput};
pub use value::Value;

/// Why a kernel failed on its inputs.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// An input of a kind the op cannot take (a table where a tensor belongs …).
    #[error("input {index}: {reason}")]
    Input { index: usize, reason: &'static str },
    #[error(transparent)]
    Tensor(#[from] crate::Error),
    /// A function call inside the node failed.
    #[error("in function {function}: {source}")]
    Function {
        function: String,
        #[source]
        source: Box<ExecError>,
    },
}

impl Failure {
    /// The batch element (record or example) a parsing failure names, if any.
    pub fn record(&self) -> Option<usize> {
        match self {
            Failure::Parse(e) => e.record(),
            Failure::Function { source, .. } => source.record_index(),
            _ => None,
        }
    }
}

/// Errors of loading and running a stage.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Ops the executor has no kernel for: op → the nodes that use it.
    #[error("{}", missing_message(.missing))]
    MissingKernels {
        missing: BTreeMap<String, Vec<String>>,
    },
    /// The graph is not one the executor can run (a dangling input, a cycle, an attribute
    /// of the wrong kind …).
    #[error("node {node}: {reason}")]
    Graph { node: String, reason: String },
    /// A node's attribute could not be read.
    #[error(transparent)]
    Attr(Box<lode_proto::Error>),
    /// A kernel refused its inputs.
    #[error("node {node} ({op}): {source}")]
    Kernel {
        node: String,
        op: String,
        #[source]
        source: Box<Failure>,
    },
    /// The dataset chain between the source and the iterator cannot be run.
    #[error("dataset node {node} ({op}): {reason}")]
    Dataset {
        node: String,
        op: String,
        reason: String,
    },
    /// Reading a record failed (the error names the file and the record).
    #[error(transparent)]
    Record(Box<crate::Error>),
    /// A step's records, for an error while processing them.
    #[error("{what}: {source}")]
    InRecords {
        what: String,
        #[source]
        source: Box<ExecError>,
    },
    /// A step input is missing or of the wrong kind.
    #[error("step input: {reason}")]
    Input { reason: String },
}

impl ExecError {
    fn record_index(&self) -> Option<usize> {
        match self {
            ExecError::Kernel { source, .. } => source.record(),
            _ => None,
        }
    }

    /// Whether the error is about the data of a record (corrupt file, malformed line or
    /// example) rather than the graph: what `ignore_errors` skips.
    pub fn is_data_error(&self) -> bool {
        match self {
            ExecError::Record(e) => e.is_corrupt_record(),
            ExecError::Kernel { source, .. } => match source.as_ref() {
                Failure::Parse(_) => true,
                Failure::Function { source, .. } => source.is_data_error(),
                _ => false,
            },
            ExecError::InRecords { source, .. } => source.is_data_error(),
            _ => false,
        }
    }
}

impl From<lode_proto::Error> for ExecError {
    fn from(e: lode_proto::Error) -> Self {
        ExecError::Attr(Box::new(e))
    }
}

impl ExecError {
    /// A record reader's error.
    pub fn record(e: crate::Error) -> Self {
        ExecError::Record(Box::new(e))
    }
}

fn missing_message(missing: &BTreeMap<String, Vec<String>>) -> String {
    let ops: Vec<String> = missing
        .iter()
        .map(|(op, nodes)| {
            let shown: Vec<&str> = nodes.iter().take(3).map(String::as_str).collect();
            let more = if nodes.len() > 3 {
                format!(" and {} more", nodes.len() - 3)
            } else {
                String::new()
            };
            format!("{op} (used by {}{more})", shown.join(", "))
        })
        .collect();
    format!(
        "the stage uses {} op{} with no kernel in Lode: {}",
        missing.len(),
        if missing.len() == 1 { "" } else { "s" },
        ops.join("; ")
    )
}

/// The executor's result type.
pub type Result<T, E = ExecError> = std::result::Result<T, E>;
