//! `SparseCross` and `SparseCrossHashed`: crossed feature columns, each row's features of
//! every column combined (as strings joined by `_X_`, or as fingerprints folded with
//! `FingerprintCat64`), as TensorFlow 2.18.1's kernels combine them.

use super::*;

/// One feature of a crossed column: an int64 or a string.
#[derive(Clone, Copy)]
enum Feature<'a> {
    Int(i64),
    Str(&'a [u8]),
}

/// `FingerprintCat64`: TensorFlow's combination of two fingerprints.
fn fingerprint_cat64(fp1: u64, fp2: u64) -> u64 {
    const MUL: u64 = 0xc6a4_a793_5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut result = fp1 ^ MUL;
    result ^= shift_mix(fp2.wrapping_mul(MUL)).wrapping_mul(MUL);
    result = result.wrapping_mul(MUL);
    result = shift_mix(result).wrapping_mul(MUL);
    shift_mix(result)
}

/// The inputs of the cross ops, checked: for each column (sparse ones first, then dense),
/// for each row of the batch, its features in order.
fn cross_columns<'a>(
    op: &'static str,
    indices: &[&Tensor],
    values: &[&'a Tensor],
    shapes: &[&Tensor],
    dense: &[&'a Tensor],
) -> Result<(usize, Vec<Vec<Vec<Feature<'a>>>>)> {
    if indices.len() != values.len() || indices.len() != shapes.len() {
        return Err(KernelError::InvalidAttr {
            op,
            attr: "N",
            value: format!(
                "{} indices, {} values, {} shapes",
                indices.len(),
                values.len(),
                shapes.len()
            ),
            reason: "the sparse inputs must come in triples",
        });
    }
    let features = |t: &'a Tensor| -> Result<Vec<Feature<'a>>> {
        match t.data() {
            TensorData::Int64(v) => Ok(v.iter().map(|&x| Feature::Int(x)).collect()),
            TensorData::String(v) => Ok(v.iter().map(|x| Feature::Str(x)).collect()),
            _ => Err(KernelError::InputDtype {
                op,
                input: "values",
                expected: "int64 or string",
                actual: t.dtype(),
            }),
        }
    };
    let mut batch = None;
    for s in shapes {
        if s.shape() != [2] {
            return Err(shape_error(op, "shapes", s, "must be a vector of 2"));
        }
    }
    if let Some(s) = shapes.first() {
        batch = Some(int64s(op, "shapes", s)?[0]);
    } else if let Some(d) = dense.first() {
        batch = d.shape().first().map(|&b| to_i64(b));
    }
    let batch = batch.unwrap_or(0);
    let rows = usize::try_from(batch).map_err(|_| {
        bad_value(
            op,
            "shapes",
            batch.to_string(),
            "the batch size must be non-negative",
        )
    })?;
    let mut columns = Vec::with_capacity(indices.len() + dense.len());
    for ((ind, val), shape) in indices.iter().zip(values).zip(shapes) {
        if ind.shape().len() != 2 || ind.shape()[1] != 2 {
            return Err(shape_error(
                op,
                "indices",
                ind,
                "must be a matrix of [nnz, 2]",
            ));
        }
        if val.shape().len() != 1 || val.shape()[0] != ind.shape()[0] {
            return Err(KernelError::IncompatibleShapes {
                op,
                left: "indices",
                left_shape: ind.shape().to_vec(),
                right: "values",
                right_shape: val.shape().to_vec(),
            });
        }
        if int64s(op, "shapes", shape)?[0] != batch {
            return Err(bad_value(
                op,
                "shapes",
                format!("{:?}", shape.data()),
                "every input must have the same batch size",
            ));
        }
        let ind = int64s(op, "indices", ind)?;
        let feats = features(val)?;
        // TensorFlow walks the entries once, taking for row b the run of entries at the
        // cursor whose row is b: entries out of order or out of range end a row's run and
        // are never crossed.
        let mut cursor = 0usize;
        let mut column = Vec::with_capacity(rows);
        for b in 0..rows {
            let start = cursor;
            while ind
                .get(2 * cursor)
                .is_some_and(|&r| usize::try_from(r).is_ok_and(|r| r == b))
            {
                cursor += 1;
            }
            column.push(feats[start..cursor].to_vec());
        }
        columns.push(column);
    }
    for d in dense {
        if d.shape().len() != 2 || d.shape()[0] != rows {
            return Err(shape_error(
                op,
                "dense_inputs",
                d,
                "must be a matrix of [batch, k]",
            ));
        }
        let feats = features(d)?;
        let k = d.shape()[1];
        columns.push(
            (0..rows)
                .map(|r| feats[r * k..(r + 1) * k].to_vec())
                .collect(),
        );
    }
    Ok((rows, columns))
}

/// The cross of each row: every combination of one feature per column, the last column
/// varying fastest, turned into an output value by `cross`. Returns the outputs
/// (`indices`, `values`, `dense_shape`).
fn cross_rows<'a, T>(
    op: &'static str,
    rows: usize,
    columns: &[Vec<Vec<Feature<'a>>>],
    mut cross: impl FnMut(&[Feature<'a>]) -> T,
    wrap: impl FnOnce(Vec<T>) -> TensorData,
) -> Result<Vec<Tensor>> {
    let mut indices = Vec::new();
    let mut values = Vec::new();
    let mut width = 0usize;
    let mut picked = Vec::with_capacity(columns.len());
    for r in 0..rows {
        let counts: Vec<usize> = columns.iter().map(|c| c[r].len()).collect();
        if columns.is_empty() || counts.contains(&0) {
            continue;
        }
        let mut at = vec![0usize; columns.len()];
        let mut n = 0i64;
        loop {
            picked.clear();
            picked.extend(columns.iter().zip(&at).map(|(c, &i)| c[r][i]));
            values.push(cross(&picked));
            indices.extend([to_i64(r), n]);
            n += 1;
            // Odometer: the last column first.
            let mut d = columns.len();
            loop {
                if d == 0 {
                    break;
                }
                d -= 1;
                at[d] += 1;
                if at[d] < counts[d] {
                    break;
                }
                at[d] = 0;
            }
            if at.iter().all(|&i| i == 0) {
                break;
            }
        }
        width = width.max(usize::try_from(n).unwrap_or(0));
    }
    let nnz = values.len();
    Ok(vec![
        output(op, vec![nnz, 2], TensorData::Int64(indices))?,
        output(op, vec![nnz], wrap(values))?,
        output(
            op,
            vec![2],
            TensorData::Int64(vec![to_i64(rows), to_i64(width)]),
        )?,
    ])
}

/// Hashes of crossed features folded from `hash_key` with `FingerprintCat64`, reduced
/// modulo `num_buckets` (or `i64::MAX` when it is 0).
fn hashed_cross(hash_key: u64, num_buckets: u64, hashes: impl Iterator<Item = u64>) -> i64 {
    let h = hashes.fold(hash_key, fingerprint_cat64);
    let m = if num_buckets > 0 {
        num_buckets
    } else {
        i64::MAX.unsigned_abs()
    };
    i64::try_from(h % m).unwrap_or(i64::MAX)
}

/// `SparseCross`'s attributes.
#[derive(Debug, Clone, Copy)]
pub struct SparseCrossAttrs {
    /// Hash the crosses into int64s (else join them into strings with `_X_`).
    pub hashed_output: bool,
    /// Buckets of the hashed output (0: `i64::MAX`).
    pub num_buckets: i64,
    /// The seed of the hash fold.
    pub hash_key: i64,
}

/// `SparseCross`: the cross of sparse (`indices`, `values`, `shapes` triples) and dense
/// `[batch, k]` columns, row by row. Strings cross as `a_X_b` (int64s in decimal); hashed,
/// a string is its `Fingerprint64` and an int64 itself, folded with `FingerprintCat64`
/// from `hash_key`.
pub fn sparse_cross(
    indices: &[&Tensor],
    values: &[&Tensor],
    shapes: &[&Tensor],
    dense_inputs: &[&Tensor],
    attrs: SparseCrossAttrs,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseCross";
    let num_buckets = u64::try_from(attrs.num_buckets).map_err(|_| KernelError::InvalidAttr {
        op: OP,
        attr: "num_buckets",
        value: attrs.num_buckets.to_string(),
        reason: "must be non-negative",
    })?;
    let (rows, columns) = cross_columns(OP, indices, values, shapes, dense_inputs)?;
    if attrs.hashed_output {
        let key = attrs.hash_key as u64;
        let hash = |f: &Feature| match *f {
            Feature::Int(v) => v as u64,
            Feature::Str(s) => crate::hash::fingerprint64(s),
        };
        cross_rows(
            OP,
            rows,
            &columns,
            |fs| hashed_cross(key, num_buckets, fs.iter().map(hash)),
            TensorData::Int64,
        )
    } else {
        cross_rows(
            OP,
            rows,
            &columns,
            |fs| {
                let mut s = Vec::new();
                for (i, f) in fs.iter().enumerate() {
                    if i > 0 {
                        s.extend_from_slice(b"_X_");
                    }
                    match *f {
                        Feature::Int(v) => s.extend_from_slice(v.to_string().as_bytes()),
                        Feature::Str(x) => s.extend_from_slice(x),
                    }
                }
                s
            },
            TensorData::String,
        )
    }
}

/// `SparseCrossHashed`: `SparseCross` with hashed output, its bucket count and hash choice
/// as tensors. Unlike `SparseCross` there is no hash key: the fold starts from the first
/// column's hash (a single column gives `Fingerprint64(s) % i64::MAX`); with `strong_hash`
/// a string is hashed with SipHash-2-4 keyed by `salt`.
///
/// An int64 feature of a sparse column is hashed from its first 4 little-endian bytes
/// (TensorFlow passes `sizeof(DataType)` as the length); one of a dense column is its own
/// hash, and refused with `strong_hash` (TensorFlow reads the value as a pointer there).
pub fn sparse_cross_hashed(
    indices: &[&Tensor],
    values: &[&Tensor],
    shapes: &[&Tensor],
    dense_inputs: &[&Tensor],
    num_buckets: &Tensor,
    strong_hash: &Tensor,
    salt: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseCrossHashed";
    let buckets = int64s(OP, "num_buckets", num_buckets)?;
    let &[buckets] = buckets else {
        return Err(shape_error(
            OP,
            "num_buckets",
            num_buckets,
            "must be a scalar",
        ));
    };
    let buckets = u64::try_from(buckets).map_err(|_| {
        bad_value(
            OP,
            "num_buckets",
            buckets.to_string(),
            "must be non-negative",
        )
    })?;
    let strong = match strong_hash.data() {
        TensorData::Bool(v) if v.len() == 1 => v[0],
        _ => {
            return Err(shape_error(
                OP,
                "strong_hash",
                strong_hash,
                "must be a bool scalar",
            ))
        }
    };
    let salt = int64s(OP, "salt", salt)?;
    let (k0, k1) = match salt {
        [a, b, ..] => (*a as u64, *b as u64),
        _ if !strong => (0, 0),
        _ => return Err(bad_value(OP, "salt", format!("{salt:?}"), "needs two keys")),
    };
    let (rows, columns) = cross_columns(OP, indices, values, shapes, dense_inputs)?;
    let n_sparse = indices.len();
    let dense_int = dense_inputs.iter().any(|d| d.dtype() == DType::Int64);
    if strong && dense_int {
        // TensorFlow reinterprets the int64 value itself as a pointer here.
        return Err(KernelError::InputDtype {
            op: OP,
            input: "dense_inputs",
            expected: "string (with strong_hash)",
            actual: DType::Int64,
        });
    }
    // An int64 of a sparse column hashes its first 4 little-endian bytes (TensorFlow passes
    // `sizeof(DataType)` as the length); of a dense column, it is its own hash.
    let hash = |column: usize, f: &Feature| match *f {
        Feature::Int(v) if column >= n_sparse => v as u64,
        Feature::Int(v) if strong => {
            crate::kernels::strings::siphash24(k0, k1, &v.to_le_bytes()[..4])
        }
        Feature::Int(v) => crate::hash::fingerprint64(&v.to_le_bytes()[..4]),
        Feature::Str(s) if strong => crate::kernels::strings::siphash24(k0, k1, s),
        Feature::Str(s) => crate::hash::fingerprint64(s),
    };
    cross_rows(
        OP,
        rows,
        &columns,
        |fs| {
            let mut hashes = fs.iter().enumerate().map(|(c, f)| hash(c, f));
            let first = hashes.next().unwrap_or(0);
            hashed_cross(first, buckets, hashes)
        },
        TensorData::Int64,
    )
}
