//! Temporary: kernels being written elsewhere.
#![allow(dead_code, unused_variables)]
use crate::kernels::{KernelError, Result};
use crate::tensor::Tensor;
fn no(op: &'static str) -> KernelError {
    KernelError::InvalidAttr {
        op,
        attr: "-",
        value: String::new(),
        reason: "pending",
    }
}
pub struct StridedSliceMasks {
    pub begin_mask: i64,
    pub end_mask: i64,
    pub ellipsis_mask: i64,
    pub new_axis_mask: i64,
    pub shrink_axis_mask: i64,
}
pub fn slice(input: &Tensor, begin: &Tensor, size: &Tensor) -> Result<Vec<Tensor>> {
    Err(no("Slice"))
}
pub fn strided_slice(
    input: &Tensor,
    begin: &Tensor,
    end: &Tensor,
    strides: &Tensor,
    masks: &StridedSliceMasks,
) -> Result<Vec<Tensor>> {
    Err(no("StridedSlice"))
}
pub fn gather_v2(
    params: &Tensor,
    indices: &Tensor,
    axis: &Tensor,
    batch_dims: i64,
) -> Result<Vec<Tensor>> {
    Err(no("GatherV2"))
}
pub fn tile(input: &Tensor, multiples: &Tensor) -> Result<Vec<Tensor>> {
    Err(no("Tile"))
}
pub fn transpose(x: &Tensor, perm: &Tensor) -> Result<Vec<Tensor>> {
    Err(no("Transpose"))
}
pub fn one_hot(
    indices: &Tensor,
    depth: &Tensor,
    on_value: &Tensor,
    off_value: &Tensor,
    axis: i64,
) -> Result<Vec<Tensor>> {
    Err(no("OneHot"))
}
pub fn neg(x: &Tensor) -> Result<Vec<Tensor>> {
    Err(no("Neg"))
}
pub fn regex_replace(
    input: &Tensor,
    pattern: &Tensor,
    rewrite: &Tensor,
    replace_global: bool,
) -> Result<Vec<Tensor>> {
    Err(no("RegexReplace"))
}
