//! What flows along a stage graph's edges.

use std::sync::{Arc, RwLock};

use crate::kernels::lookup::HashTable;
use crate::tensor::Tensor;

/// A `DT_VARIANT` tensor whose elements each hold one tensor, as `SerializeSparse` with
/// `out_type = variant` makes them (a `[3]` vector: indices, values, dense shape) and as
/// batching stacks them (`[B, 3]`).
#[derive(Debug, Clone)]
pub struct VariantTensor {
    pub shape: Vec<usize>,
    /// One tensor per element, row-major.
    pub elements: Vec<Tensor>,
}

/// A lookup table resource: filled by its initializers when the stage loads, then read.
pub type TableCell = RwLock<HashTable>;

/// One output of a node.
#[derive(Debug, Clone)]
pub enum Value {
    Tensor(Arc<Tensor>),
    Variant(Arc<VariantTensor>),
    Table(Arc<TableCell>),
}

impl Value {
    pub fn tensor(t: Tensor) -> Value {
        Value::Tensor(Arc::new(t))
    }

    /// The dense tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The leading shape, whatever the kind (a table is a scalar handle).
    pub fn shape(&self) -> &[usize] {
        match self {
            Value::Tensor(t) => t.shape(),
            Value::Variant(v) => &v.shape,
            Value::Table(_) => &[],
        }
    }

    /// A short description for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "a tensor",
            Value::Variant(_) => "a variant tensor",
            Value::Table(_) => "a table handle",
        }
    }
}
