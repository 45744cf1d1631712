//! The errors of `lode-proto`: every variant names the file or node it is about.

use std::path::PathBuf;

use crate::text::TextError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the file is empty", path.display())]
    Empty { path: PathBuf },
    #[error("{}: {size} bytes is more than the {limit}-byte limit of a protobuf message", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{}: not a valid binary {what}: at byte {offset}: {source}{}", path.display(), decode_hint(source))]
    Decode {
        path: PathBuf,
        what: &'static str,
        /// Where decoding stopped.
        offset: u64,
        #[source]
        source: protobuf::Error,
    },
    #[error("{}: not a valid text {what}: {source}", path.display())]
    Text {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: TextError,
    },
    #[error("{}: a directory without saved_model.pb or saved_model.pbtxt is not a SavedModel", path.display())]
    NotASavedModel { path: PathBuf },
    #[error("{}: no MetaGraph has the tags {}; the SavedModel has {}", path.display(), tag_set(wanted), tag_sets(available))]
    TagsNotFound {
        path: PathBuf,
        wanted: Vec<String>,
        available: Vec<Vec<String>>,
    },
    #[error("{}: the SavedModel holds several MetaGraphs; choose one with --tags: {}", path.display(), tag_sets(available))]
    AmbiguousTags {
        path: PathBuf,
        available: Vec<Vec<String>>,
    },
    #[error("{}: {reason}", path.display())]
    InvalidModel { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    InvalidOutput { path: PathBuf, reason: String },
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: protobuf::Error,
    },
    #[error("bad tensor name '{name}': {reason}")]
    TensorName { name: String, reason: &'static str },
    #[error("node '{node}' uses op '{op}', which TensorFlow 2.18 does not register and the graph's function library does not define")]
    UnknownOp { node: String, op: String },
    #[error("node '{node}' ({op}) has no attribute '{attr}'")]
    MissingAttr {
        node: String,
        op: String,
        attr: String,
    },
    #[error("node '{node}' ({op}): attribute '{attr}' holds {found}, expected {expected}")]
    AttrType {
        node: String,
        op: String,
        attr: String,
        expected: &'static str,
        found: &'static str,
    },
}

fn tag_set(tags: &[String]) -> String {
    format!("[{}]", tags.join(","))
}

fn tag_sets(sets: &[Vec<String>]) -> String {
    sets.iter()
        .map(|t| tag_set(t))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Plain words for the protobuf decoder's terse messages.
fn decode_hint(err: &protobuf::Error) -> &'static str {
    let text = err.to_string();
    if text.contains("EOF") || text.contains("greater than current limit") {
        " (the data ends inside a field: is the file truncated?)"
    } else if text.contains("tag") || text.contains("wire type") {
        " (these bytes are not protobuf wire format at this point: wrong file or corrupted?)"
    } else if text.contains("recursion") {
        " (messages nest deeper than Lode's limit of 100 levels)"
    } else {
        ""
    }
}
