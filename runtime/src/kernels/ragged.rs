//! Ragged-tensor kernels (ragged rank 1, the rank `tf.strings.split`, TextVectorization and
//! feature columns produce): `RaggedTensorToTensor` (row partition `ROW_SPLITS`, or
//! `FIRST_DIM_SIZE` + `VALUE_ROWIDS`), `RaggedTensorToSparse`, and `StringNGrams` (which
//! reads and writes row splits), as TensorFlow 2.18.1's CPU kernels compute them. They only
//! move values (n-grams concatenate bytes), so outputs are bit-exact by construction.

use super::sparse::take;
use super::{int_values, output, strings_of, KernelError, Result};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData};

fn invalid(op: &'static str, input: &'static str, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidInput {
        op,
        input,
        reason: reason.into(),
    }
}

/// Row splits checked as TensorFlow checks them: starting at 0, non-decreasing, ending at
/// the number of values.
fn check_splits(
    op: &'static str,
    input: &'static str,
    splits: &[i64],
    values: usize,
) -> Result<()> {
    let Some((&first, _)) = splits.split_first() else {
        return Err(invalid(op, input, "Invalid split value."));
    };
    if first != 0 {
        return Err(invalid(
            op,
            input,
            format!("First value of ragged splits must be 0, but is {first}"),
        ));
    }
    if splits.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid(op, input, "Ragged splits must be non-decreasing."));
    }
    let last = splits[splits.len() - 1];
    if usize::try_from(last).ok() != Some(values) {
        return Err(invalid(
            op,
            input,
            format!("Final value of ragged splits must match the length the corresponding values: {last} vs {values}"),
        ));
    }
    Ok(())
}

/// The row of each value and its place in that row, from one row partition.
struct Rows {
    nrows: usize,
    /// Per value: (row, column).
    place: Vec<(usize, usize)>,
    widest: usize,
}

fn rows_from_splits(op: &'static str, splits: &[i64], values: usize) -> Result<Rows> {
    check_splits(op, "row_partition_tensors", splits, values)?;
    let nrows = splits.len() - 1;
    let mut place = Vec::with_capacity(values);
    let mut widest = 0;
    for (r, w) in splits.windows(2).enumerate() {
        let n = usize::try_from(w[1] - w[0]).unwrap_or(0);
        widest = widest.max(n);
        place.extend((0..n).map(|c| (r, c)));
    }
    Ok(Rows {
        nrows,
        place,
        widest,
    })
}

fn rows_from_rowids(op: &'static str, nrows: i64, rowids: &[i64], values: usize) -> Result<Rows> {
    let nrows = usize::try_from(nrows)
        .map_err(|_| invalid(op, "row_partition_tensors", "first_dim_size must be >= 0"))?;
    if rowids.len() != values {
        return Err(invalid(
            op,
            "row_partition_tensors",
            format!(
                "value_rowids has {} entries but there are {values} values",
                rowids.len()
            ),
        ));
    }
    let mut place = Vec::with_capacity(values);
    let mut widest = 0;
    let mut prev: Option<(i64, usize)> = None;
    for &r in rowids {
        let col = match prev {
            Some((p, c)) if p == r => c + 1,
            Some((p, _)) if r < p => {
                return Err(invalid(
                    op,
                    "row_partition_tensors",
                    "value_rowids must be sorted",
                ))
            }
            _ => 0,
        };
        let row = usize::try_from(r)
            .map_err(|_| invalid(op, "row_partition_tensors", format!("Invalid row id {r}")))?;
        prev = Some((r, col));
        widest = widest.max(col + 1);
        place.push((row, col));
    }
    Ok(Rows {
        nrows,
        place,
        widest,
    })
}

/// `RaggedTensorToTensor` of ragged rank 1: `values` (first dimension the values, the rest
/// the inner shape) laid out in rows padded with `default_value`; `shape` (a vector, or a
/// scalar -1 for "unknown") caps or sets the rows and columns where it is not -1.
pub fn ragged_tensor_to_tensor(
    shape: &Tensor,
    values: &Tensor,
    default_value: &Tensor,
    partitions: &[&Tensor],
    types: &[String],
) -> Result<Vec<Tensor>> {
    const OP: &str = "RaggedTensorToTensor";
    let Some((&nvalues, inner)) = values.shape().split_first() else {
        return Err(invalid(OP, "values", "values must have rank at least 1"));
    };
    let rows = match (
        types
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice(),
        partitions,
    ) {
        (["ROW_SPLITS"], [splits]) => rows_from_splits(
            OP,
            &int_values(OP, "row_partition_tensors", splits)?,
            nvalues,
        )?,
        (["FIRST_DIM_SIZE", "VALUE_ROWIDS"], [size, rowids]) => {
            let n = int_values(OP, "row_partition_tensors", size)?
                .first()
                .copied()
                .unwrap_or(0);
            rows_from_rowids(
                OP,
                n,
                &int_values(OP, "row_partition_tensors", rowids)?,
                nvalues,
            )?
        }
        _ => return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "row_partition_types",
            value: format!("{types:?}"),
            reason:
                "only ragged rank 1 (ROW_SPLITS, or FIRST_DIM_SIZE and VALUE_ROWIDS) is supported",
        }),
    };
    let want = int_values(OP, "shape", shape)?;
    let want = if shape.shape().is_empty() {
        Vec::new()
    } else {
        want
    };
    if !want.is_empty() && want.len() != inner.len() + 2 {
        return Err(invalid(
            OP,
            "shape",
            format!(
                "rt_input.shape and shape={want:?} are not compatible: rank {} vs {}",
                inner.len() + 2,
                want.len()
            ),
        ));
    }
    let pick = |d: usize, natural: usize| -> usize {
        want.get(d)
            .and_then(|&v| usize::try_from(v).ok())
            .unwrap_or(natural)
    };
    let nrows = pick(0, rows.nrows);
    let ncols = pick(1, rows.widest);
    for (d, &n) in inner.iter().enumerate() {
        if let Some(&v) = want.get(d + 2) {
            if v >= 0 && usize::try_from(v).ok() != Some(n) {
                return Err(invalid(
                    OP,
                    "shape",
                    format!("shape dimension {} is {v} but the values' is {n}", d + 2),
                ));
            }
        }
    }
    let width: usize = inner.iter().product();
    let mut out_shape = vec![nrows, ncols];
    out_shape.extend_from_slice(inner);
    checked_num_elements(values.dtype(), &out_shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let dflt_n = default_value.num_elements();
    if dflt_n != 1 && dflt_n != width {
        return Err(invalid(
            OP,
            "default_value",
            format!(
                "default_value.shape={:?} and rt_input.flat_values.shape={:?} are incompatible",
                default_value.shape(),
                values.shape()
            ),
        ));
    }
    if default_value.dtype() != values.dtype() {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "default_value",
            expected: values.dtype().name(),
            actual: default_value.dtype(),
        });
    }
    // Sources index the concatenation [values..., default...].
    let total = nrows * ncols * width;
    let base = nvalues * width;
    let mut src: Vec<usize> = (0..total)
        .map(|k| base + if dflt_n == 1 { 0 } else { k % width })
        .collect();
    for (v, &(r, c)) in rows.place.iter().enumerate() {
        if r < nrows && c < ncols {
            let at = (r * ncols + c) * width;
            for j in 0..width {
                src[at + j] = v * width + j;
            }
        }
    }
    let data = super::sparse::take_concat(values.data(), default_value.data(), &src)
        .ok_or_else(|| invalid(OP, "default_value", "dtype mismatch"))?;
    Ok(vec![output(OP, out_shape, data)?])
}

/// `RaggedTensorToSparse` of ragged rank 1: the sparse indices (row, column, then the inner
/// positions), the values flattened, and the dense shape `[rows, widest row, inner...]`.
pub fn ragged_tensor_to_sparse(splits: &[&Tensor], values: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "RaggedTensorToSparse";
    let [splits] = splits else {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "RAGGED_RANK",
            value: splits.len().to_string(),
            reason: "only ragged rank 1 is supported",
        });
    };
    let Some((&nvalues, inner)) = values.shape().split_first() else {
        return Err(invalid(
            OP,
            "rt_dense_values",
            "values must have rank at least 1",
        ));
    };
    let s = int_values(OP, "rt_nested_splits", splits)?;
    let rows = rows_from_splits(OP, &s, nvalues)?;
    let width: usize = inner.iter().product();
    let rank = 2 + inner.len();
    let mut indices = Vec::with_capacity(nvalues * width * rank);
    for &(r, c) in &rows.place {
        for j in 0..width {
            indices.push(i64::try_from(r).unwrap_or(i64::MAX));
            indices.push(i64::try_from(c).unwrap_or(i64::MAX));
            let mut rest = j;
            let mut pos = vec![0i64; inner.len()];
            for (d, &n) in inner.iter().enumerate().rev() {
                pos[d] = i64::try_from(rest % n.max(1)).unwrap_or(0);
                rest /= n.max(1);
            }
            indices.extend(pos);
        }
    }
    let mut dense = vec![
        i64::try_from(rows.nrows).unwrap_or(i64::MAX),
        i64::try_from(rows.widest).unwrap_or(i64::MAX),
    ];
    dense.extend(inner.iter().map(|&n| i64::try_from(n).unwrap_or(i64::MAX)));
    let n = nvalues * width;
    let flat: Vec<usize> = (0..n).collect();
    Ok(vec![
        output(OP, vec![n, rank], TensorData::Int64(indices))?,
        output(OP, vec![n], take(values.data(), &flat))?,
        output(OP, vec![rank], TensorData::Int64(dense))?,
    ])
}

/// The widest n-gram (and padding) Lode builds: a hostile attribute could otherwise ask for
/// n-grams of billions of pads.
pub const MAX_NGRAM_WIDTH: i64 = 1 << 16;

/// `StringNGrams`' attributes.
#[derive(Debug, Clone)]
pub struct NGramAttrs {
    pub separator: Vec<u8>,
    pub ngram_widths: Vec<i64>,
    pub left_pad: Vec<u8>,
    pub right_pad: Vec<u8>,
    pub pad_width: i64,
    pub preserve_short_sequences: bool,
}

impl NGramAttrs {
    /// Padding never wider than `width - 1`; a negative `pad_width` means `width - 1`.
    fn pad(&self, width: i64) -> i64 {
        let p = if self.pad_width < 0 {
            width - 1
        } else {
            self.pad_width
        };
        p.min(width - 1)
    }

    fn count(&self, length: i64, width: i64) -> i64 {
        (length + 2 * self.pad(width) - width + 1).max(0)
    }

    /// The `num` n-grams of `width` over `data`, as TensorFlow's `CreateNgrams` builds them.
    fn create(&self, data: &[Vec<u8>], num: i64, width: i64, pad: i64, out: &mut Vec<Vec<u8>>) {
        for k in 0..num {
            let left = (pad - k).max(0);
            let right = (pad - (num - (k + 1))).max(0);
            let tokens = width - (left + right);
            let start = if left > 0 { 0 } else { k - pad };
            let mut g = Vec::new();
            for _ in 0..left {
                g.extend_from_slice(&self.left_pad);
                g.extend_from_slice(&self.separator);
            }
            let token = |n: i64| -> &[u8] {
                usize::try_from(start + n)
                    .ok()
                    .and_then(|i| data.get(i))
                    .map_or(&[][..], Vec::as_slice)
            };
            for n in 0..tokens - 1 {
                g.extend_from_slice(token(n));
                g.extend_from_slice(&self.separator);
            }
            if tokens > 0 {
                g.extend_from_slice(token(tokens - 1));
                for _ in 0..right {
                    g.extend_from_slice(&self.separator);
                    g.extend_from_slice(&self.right_pad);
                }
            } else {
                for _ in 0..right - 1 {
                    g.extend_from_slice(&self.right_pad);
                    g.extend_from_slice(&self.separator);
                }
                g.extend_from_slice(&self.right_pad);
            }
            out.push(g);
        }
    }
}

/// `StringNGrams`: the n-grams of each row of a ragged string tensor (`data` with
/// `data_splits`), for each width in turn, with TensorFlow's padding and short-sequence rules.
pub fn string_ngrams(data: &Tensor, splits: &Tensor, attrs: &NGramAttrs) -> Result<Vec<Tensor>> {
    const OP: &str = "StringNGrams";
    let tokens = strings_of(OP, "data", data)?;
    if data.shape().len() != 1 {
        return Err(invalid(OP, "data", "Input data must be a vector"));
    }
    let s = int_values(OP, "data_splits", splits)?;
    if s.is_empty() {
        // TensorFlow: no rows, no n-grams.
        return Ok(vec![
            output(OP, vec![0], TensorData::String(Vec::new()))?,
            output(OP, vec![1], splits_data(splits.dtype(), vec![0]))?,
        ]);
    }
    // TensorFlow's own checks and messages for the splits of StringNGrams.
    if s[0] != 0 {
        return Err(invalid(
            OP,
            "data_splits",
            format!("First split value must be 0, got {}", s[0]),
        ));
    }
    let len = i64::try_from(tokens.len()).unwrap_or(i64::MAX);
    for w in s.windows(2) {
        if w[1] < w[0] || w[1] > len {
            return Err(invalid(
                OP,
                "data_splits",
                format!("Invalid split value {}, must be in [{}, {len}]", w[1], w[0]),
            ));
        }
    }
    if let Some(&w) = attrs
        .ngram_widths
        .iter()
        .find(|&&w| w <= 0 || w > MAX_NGRAM_WIDTH)
    {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "ngram_widths",
            value: w.to_string(),
            reason: "must be positive and at most MAX_NGRAM_WIDTH (Lode's bound)",
        });
    }
    if attrs.pad_width > MAX_NGRAM_WIDTH {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "pad_width",
            value: attrs.pad_width.to_string(),
            reason: "must be at most MAX_NGRAM_WIDTH (Lode's bound)",
        });
    }
    let mut out = Vec::new();
    let mut out_splits = vec![0i64];
    for w in s.windows(2) {
        let (from, to) = (
            usize::try_from(w[0]).unwrap_or(0),
            usize::try_from(w[1]).unwrap_or(0),
        );
        let row = &tokens[from..to];
        let length = i64::try_from(row.len()).unwrap_or(i64::MAX);
        let before = out.len();
        for &width in &attrs.ngram_widths {
            let num = attrs.count(length, width);
            attrs.create(row, num, width, attrs.pad(width), &mut out);
        }
        if attrs.preserve_short_sequences && out.len() == before && length > 0 {
            // No width fits: one n-gram of the whole row with its padding.
            let width = length.saturating_add(2 * attrs.pad_width);
            attrs.create(row, 1, width, attrs.pad(width), &mut out);
        }
        out_splits.push(i64::try_from(out.len()).unwrap_or(i64::MAX));
    }
    let n = out.len();
    let ns = out_splits.len();
    Ok(vec![
        output(OP, vec![n], TensorData::String(out))?,
        output(OP, vec![ns], splits_data(splits.dtype(), out_splits))?,
    ])
}

fn splits_data(dtype: DType, v: Vec<i64>) -> TensorData {
    if dtype == DType::Int32 {
        TensorData::Int32(
            v.into_iter()
                .map(|x| i32::try_from(x).unwrap_or(i32::MAX))
                .collect(),
        )
    } else {
        TensorData::Int64(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Tensor {
        Tensor::new(
            vec![v.len()],
            TensorData::String(v.iter().map(|x| x.as_bytes().to_vec()).collect()),
        )
        .expect("t")
    }

    fn i64s(v: Vec<i64>) -> Tensor {
        Tensor::new(vec![v.len()], TensorData::Int64(v)).expect("t")
    }

    fn strings(t: &Tensor) -> Vec<String> {
        match t.data() {
            TensorData::String(v) => v
                .iter()
                .map(|x| String::from_utf8_lossy(x).into())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Known answers from TensorFlow 2.18.1 (`tf.strings.ngrams` in eager mode).
    #[test]
    fn ngrams_pad_and_split_as_tensorflow() {
        let data = s(&["a", "b", "c", "d"]);
        let splits = i64s(vec![0, 3, 3, 4]);
        let attrs = NGramAttrs {
            separator: b" ".to_vec(),
            ngram_widths: vec![2],
            left_pad: b"<s>".to_vec(),
            right_pad: b"</s>".to_vec(),
            pad_width: 1,
            preserve_short_sequences: false,
        };
        let out = string_ngrams(&data, &splits, &attrs).expect("ngrams");
        assert_eq!(
            strings(&out[0]),
            ["<s> a", "a b", "b c", "c </s>", "<s> </s>", "<s> d", "d </s>"]
        );
        assert_eq!(out[1].data(), &TensorData::Int64(vec![0, 4, 5, 7]));
        let plain = NGramAttrs {
            pad_width: 0,
            ngram_widths: vec![3],
            ..attrs
        };
        let out = string_ngrams(&data, &splits, &plain).expect("ngrams");
        assert_eq!(strings(&out[0]), ["a b c"]);
        assert_eq!(out[1].data(), &TensorData::Int64(vec![0, 1, 1, 1]));
    }

    #[test]
    fn ragged_to_tensor_pads_and_truncates() {
        let values = i64s(vec![1, 2, 3, 4, 5]);
        let default = Tensor::new(vec![], TensorData::Int64(vec![-1])).expect("t");
        let size = Tensor::new(vec![], TensorData::Int64(vec![3])).expect("t");
        let rowids = i64s(vec![0, 0, 0, 2, 2]);
        let shape = i64s(vec![-1, 2]);
        let types = vec!["FIRST_DIM_SIZE".to_owned(), "VALUE_ROWIDS".to_owned()];
        let out = ragged_tensor_to_tensor(&shape, &values, &default, &[&size, &rowids], &types)
            .expect("dense");
        assert_eq!(out[0].shape(), &[3, 2]);
        assert_eq!(out[0].data(), &TensorData::Int64(vec![1, 2, -1, -1, 4, 5]));
        let sparse = ragged_tensor_to_sparse(&[&i64s(vec![0, 3, 3, 5])], &values).expect("sparse");
        assert_eq!(
            sparse[0].data(),
            &TensorData::Int64(vec![0, 0, 0, 1, 0, 2, 2, 0, 2, 1])
        );
        assert_eq!(sparse[2].data(), &TensorData::Int64(vec![3, 3]));
        let err = ragged_tensor_to_sparse(&[&i64s(vec![0, 3, 2, 5])], &values).expect_err("bad");
        assert!(err.to_string().contains("non-decreasing"), "{err}");
    }
}
