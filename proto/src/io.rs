//! Loading models from disk in every form TensorFlow writes them, and writing GraphDefs.
//!
//! A model path is one of: a binary GraphDef (`.pb`, or anything not recognised otherwise), a
//! text GraphDef (`.pbtxt`, `.pbtext`, `.txt`, `.prototxt`), a MetaGraphDef (`.meta`, binary or
//! text), or a SavedModel (a directory holding `saved_model.pb` or `saved_model.pbtxt`, or the
//! file itself). Text is told from binary by content, so a mislabelled file still loads; the
//! message type of a text file is told from its first field name.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use protobuf::{CodedInputStream, Message, MessageFull};

use crate::error::{Error, Result};
use crate::text;
use crate::tf::graph::GraphDef;
use crate::tf::meta_graph::MetaGraphDef;
use crate::tf::saved_model::SavedModel;

/// Deepest message nesting accepted in binary and text (as protobuf's own default; the
/// deepest real TensorFlow graphs nest a few dozen levels).
pub const RECURSION_LIMIT: u32 = 100;

/// Largest model file Lode reads: protobuf messages cannot exceed 2 GiB.
pub const MAX_MODEL_BYTES: u64 = (1 << 31) - 1;

/// The form a model was stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    GraphDef,
    GraphDefText,
    MetaGraph,
    MetaGraphText,
    SavedModel,
    SavedModelText,
}

impl ModelFormat {
    /// Stable name used in `lode inspect` output.
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::GraphDef => "graphdef",
            ModelFormat::GraphDefText => "graphdef-text",
            ModelFormat::MetaGraph => "metagraph",
            ModelFormat::MetaGraphText => "metagraph-text",
            ModelFormat::SavedModel => "savedmodel",
            ModelFormat::SavedModelText => "savedmodel-text",
        }
    }
}

/// The output encoding of a GraphDef.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphEncoding {
    Binary,
    Text,
}

/// What to pick inside a model that holds several graphs.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// The SavedModel tag set to select; None picks the only MetaGraph.
    pub tags: Option<Vec<String>>,
}

/// A loaded model: the graph Lode works on and where it came from.
#[derive(Debug, Clone)]
pub struct Model {
    /// The file the graph was read from (`saved_model.pb` for a SavedModel directory).
    pub path: PathBuf,
    pub format: ModelFormat,
    pub graph: GraphDef,
    /// The MetaGraphDef the graph came from, for `.meta` files and SavedModels.
    pub meta_graph: Option<MetaGraphDef>,
    /// For SavedModels: the tag sets of all MetaGraphs in the file.
    pub available_tags: Vec<Vec<String>>,
}

impl Model {
    /// The tags of the selected MetaGraph, when it has any.
    pub fn tags(&self) -> Option<&[String]> {
        self.meta_graph
            .as_ref()
            .and_then(|m| m.meta_info_def.as_ref())
            .map(|info| info.tags.as_slice())
            .filter(|tags| !tags.is_empty())
    }
}

/// Loads a model from `path`, detecting its format.
pub fn load(path: &Path, options: &LoadOptions) -> Result<Model> {
    let metadata = fs::metadata(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    if metadata.is_dir() {
        let binary = path.join("saved_model.pb");
        let text = path.join("saved_model.pbtxt");
        let file = if binary.is_file() {
            binary
        } else if text.is_file() {
            text
        } else {
            return Err(Error::NotASavedModel {
                path: path.to_owned(),
            });
        };
        return load_saved_model(&file, options);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "saved_model.pb" || name == "saved_model.pbtxt" {
        return load_saved_model(path, options);
    }
    let bytes = read_model_file(path)?;
    let is_meta = path.extension().is_some_and(|e| e == "meta");
    let text = as_text(&bytes);
    let textual = text.is_some();
    let kind = match text.and_then(text_kind) {
        Some(kind) => kind,
        None if is_meta => TextKind::MetaGraph,
        None => TextKind::GraphDef,
    };
    match kind {
        TextKind::GraphDef => {
            let graph: GraphDef = decode(path, &bytes, textual, "GraphDef")?;
            check_graph(path, &graph)?;
            warn_if_unversioned(path, graph.versions.is_some());
            Ok(Model {
                path: path.to_owned(),
                format: if textual {
                    ModelFormat::GraphDefText
                } else {
                    ModelFormat::GraphDef
                },
                graph,
                meta_graph: None,
                available_tags: Vec::new(),
            })
        }
        TextKind::MetaGraph => {
            let meta: MetaGraphDef = decode(path, &bytes, textual, "MetaGraphDef")?;
            let graph = meta_graph_def(path, &meta)?;
            Ok(Model {
                path: path.to_owned(),
                format: if textual {
                    ModelFormat::MetaGraphText
                } else {
                    ModelFormat::MetaGraph
                },
                graph,
                meta_graph: Some(meta),
                available_tags: Vec::new(),
            })
        }
        TextKind::SavedModel => select_meta_graph(path, &bytes, textual, options),
    }
}

/// The binary GraphDef of a model, for work on large graphs through
/// [`crate::view::GraphView`]: a binary GraphDef file is returned as read (no decoding), any
/// other form is loaded and its selected GraphDef encoded.
pub fn load_graph_bytes(path: &Path, options: &LoadOptions) -> Result<(PathBuf, Vec<u8>)> {
    let is_file = fs::metadata(path)
        .map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?
        .is_file();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let is_meta = path.extension().is_some_and(|e| e == "meta");
    if is_file && !is_meta && name != "saved_model.pb" && name != "saved_model.pbtxt" {
        let bytes = read_model_file(path)?;
        if as_text(&bytes).is_none() {
            return Ok((path.to_owned(), bytes));
        }
    }
    let model = load(path, options)?;
    let bytes = encode_graph(&model.graph, GraphEncoding::Binary)?;
    Ok((model.path, bytes))
}

fn load_saved_model(file: &Path, options: &LoadOptions) -> Result<Model> {
    let bytes = read_model_file(file)?;
    let textual = as_text(&bytes).is_some();
    select_meta_graph(file, &bytes, textual, options)
}

fn select_meta_graph(
    path: &Path,
    bytes: &[u8],
    textual: bool,
    options: &LoadOptions,
) -> Result<Model> {
    let saved: SavedModel = decode(path, bytes, textual, "SavedModel")?;
    let available: Vec<Vec<String>> = saved
        .meta_graphs
        .iter()
        .map(|m| {
            let mut tags = m
                .meta_info_def
                .as_ref()
                .map(|i| i.tags.clone())
                .unwrap_or_default();
            tags.sort();
            tags
        })
        .collect();
    let index = match &options.tags {
        Some(wanted) => {
            let mut wanted = wanted.clone();
            wanted.sort();
            wanted.dedup();
            available
                .iter()
                .position(|tags| *tags == wanted)
                .ok_or_else(|| Error::TagsNotFound {
                    path: path.to_owned(),
                    wanted: wanted.clone(),
                    available: available.clone(),
                })?
        }
        None => match available.len() {
            0 => {
                return Err(Error::InvalidModel {
                    path: path.to_owned(),
                    reason: "the SavedModel holds no MetaGraph".into(),
                })
            }
            1 => 0,
            _ => {
                return Err(Error::AmbiguousTags {
                    path: path.to_owned(),
                    available: available.clone(),
                })
            }
        },
    };
    let mut meta_graphs = saved.meta_graphs;
    let meta = meta_graphs.swap_remove(index);
    let graph = meta_graph_def(path, &meta)?;
    Ok(Model {
        path: path.to_owned(),
        format: if textual {
            ModelFormat::SavedModelText
        } else {
            ModelFormat::SavedModel
        },
        graph,
        meta_graph: Some(meta),
        available_tags: available,
    })
}

fn meta_graph_def(path: &Path, meta: &MetaGraphDef) -> Result<GraphDef> {
    let Some(graph) = meta.graph_def.as_ref() else {
        return Err(Error::InvalidModel {
            path: path.to_owned(),
            reason: "the MetaGraphDef has no graph_def".into(),
        });
    };
    check_graph(path, graph)?;
    Ok(graph.clone())
}

fn read_model_file(path: &Path) -> Result<Vec<u8>> {
    read_limited(path, MAX_MODEL_BYTES)
}

/// Reads a whole non-empty file of at most `limit` bytes.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let size = fs::metadata(path).map_err(io)?.len();
    if size > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size,
            limit,
        });
    }
    let bytes = fs::read(path).map_err(io)?;
    if bytes.is_empty() {
        return Err(Error::Empty {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextKind {
    GraphDef,
    MetaGraph,
    SavedModel,
}

/// The content as text when it plausibly is text format: valid UTF-8 without control bytes
/// other than whitespace, starting (after comments) with a letter.
fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text
        .bytes()
        .any(|b| b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t' | 0x0b | 0x0c))
    {
        return None;
    }
    let first = first_word(text)?;
    first
        .starts_with(|c: char| c.is_ascii_alphabetic())
        .then_some(text)
}

fn first_word(text: &str) -> Option<&str> {
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(comment) = rest.strip_prefix('#') {
            rest = comment.split_once('\n').map_or("", |(_, after)| after);
            continue;
        }
        break;
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

fn text_kind(text: &str) -> Option<TextKind> {
    match first_word(text)? {
        "node" | "library" | "versions" | "version" | "debug_info" => Some(TextKind::GraphDef),
        "meta_info_def" | "graph_def" | "saver_def" | "collection_def" | "signature_def"
        | "asset_file_def" | "object_graph_def" => Some(TextKind::MetaGraph),
        "saved_model_schema_version" | "meta_graphs" => Some(TextKind::SavedModel),
        _ => None,
    }
}

fn decode<M: MessageFull>(
    path: &Path,
    bytes: &[u8],
    textual: bool,
    what: &'static str,
) -> Result<M> {
    if textual {
        let text = std::str::from_utf8(bytes).map_err(|_| Error::InvalidModel {
            path: path.to_owned(),
            reason: "text file is not UTF-8".into(),
        })?;
        return text::parse::<M>(text).map_err(|source| Error::Text {
            path: path.to_owned(),
            what,
            source,
        });
    }
    decode_binary_file(path, bytes, what)
}

/// Decodes the binary message `bytes` read from `path`; an error names the file, the message
/// type and the offset.
pub fn decode_binary_file<M: Message>(path: &Path, bytes: &[u8], what: &'static str) -> Result<M> {
    decode_binary_at(bytes).map_err(|(offset, source)| Error::Decode {
        path: path.to_owned(),
        what,
        offset,
        source,
    })
}

/// Decodes a binary message with Lode's explicit recursion limit; the whole of `bytes` must
/// be the message.
pub fn decode_binary<M: Message>(bytes: &[u8]) -> protobuf::Result<M> {
    decode_binary_at(bytes).map_err(|(_, e)| e)
}

/// [`decode_binary`], with the byte offset where decoding stopped on an error.
///
/// The whole input is pushed as a limit before decoding: rust-protobuf starts a stream with no
/// limit, so an embedded message whose length runs past the end of the data was read up to
/// the end and taken as complete (a GraphDef cut inside its tenth node read as a valid graph
/// of ten nodes, the last one short). With the limit, such a length is an error, as in
/// TensorFlow's own parser.
pub fn decode_binary_at<M: Message>(bytes: &[u8]) -> Result<M, (u64, protobuf::Error)> {
    let mut input = CodedInputStream::from_bytes(bytes);
    input.set_recursion_limit(RECURSION_LIMIT);
    let at = |input: &CodedInputStream<'_>, e| (input.pos(), e);
    let outer = input
        .push_limit(bytes.len() as u64)
        .map_err(|e| at(&input, e))?;
    let mut message = M::new();
    message.merge_from(&mut input).map_err(|e| at(&input, e))?;
    input.check_eof().map_err(|e| at(&input, e))?;
    input.pop_limit(outer);
    Ok(message)
}

/// The absolute directory a model's relative data paths resolve against when none is given:
/// the directory holding the model file, or for a SavedModel (given as its directory or as
/// the `saved_model.pb` inside it) the directory beside which it sits.
pub fn default_data_root(model: &Path) -> Result<PathBuf> {
    let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
    let dir = if model.is_dir() {
        model.to_path_buf()
    } else {
        parent(model)
    };
    let dir = if model.is_dir()
        || dir.join("saved_model.pb").is_file()
        || dir.join("saved_model.pbtxt").is_file()
    {
        parent(&dir)
    } else {
        dir
    };
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    fs::canonicalize(&dir).map_err(|source| Error::Io { path: dir, source })
}

/// Warns when a GraphDef lacks `versions`. TensorFlow always writes it, after the nodes and
/// the library, so a file cut between two nodes decodes as a valid, smaller graph without it:
/// the only sign of that truncation left to see. Returns whether it warned.
pub fn warn_if_unversioned(path: &Path, has_versions: bool) -> bool {
    if !has_versions {
        tracing::warn!(
            path = %path.display(),
            "the GraphDef has no `versions` field, which TensorFlow always writes last: the file may be truncated"
        );
    }
    !has_versions
}

/// Rejects what parses as protobuf but cannot be a TensorFlow graph (random bytes often parse
/// as a message made of unknown fields). Checks are linear in the graph's size.
fn check_graph(path: &Path, graph: &GraphDef) -> Result<()> {
    let invalid = |reason: String| Error::InvalidModel {
        path: path.to_owned(),
        reason,
    };
    let has_functions = graph
        .library
        .as_ref()
        .is_some_and(|l| !l.function.is_empty());
    if graph.node.is_empty() && !has_functions {
        let unknown = graph.special_fields.unknown_fields().iter().count();
        return Err(invalid(if unknown > 0 {
            format!("no nodes and {unknown} unrecognised fields: not a TensorFlow graph")
        } else {
            "the graph has no nodes".into()
        }));
    }
    let mut names = std::collections::HashSet::with_capacity(graph.node.len());
    for (i, node) in graph.node.iter().enumerate() {
        if node.name.is_empty() {
            return Err(invalid(format!("node #{i} has no name")));
        }
        if node.op.is_empty() {
            return Err(invalid(format!("node '{}' has no op", node.name)));
        }
        if !names.insert(node.name.as_str()) {
            return Err(invalid(format!("node name '{}' appears twice", node.name)));
        }
    }
    for node in &graph.node {
        for input in &node.input {
            let parsed = crate::names::Input::parse(input)
                .map_err(|e| invalid(format!("node '{}' ({}): {e}", node.name, node.op)))?;
            if !names.contains(parsed.node()) {
                return Err(invalid(format!(
                    "node '{}' ({}) reads '{input}', but no node is named '{}'",
                    node.name,
                    node.op,
                    parsed.node()
                )));
            }
        }
    }
    Ok(())
}

/// Encodes a GraphDef in the chosen encoding.
/// Writes `model`'s graph to `output` in `encoding` (atomically), refusing to write over the
/// model it was read from (`given`: the path the user named, which may be a SavedModel
/// directory). Returns the bytes written.
pub fn write_graph(
    model: &Model,
    given: &Path,
    output: &Path,
    encoding: GraphEncoding,
) -> Result<usize> {
    let same = |a: &Path| match (a.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&model.path) || same(given) {
        return Err(Error::Io {
            path: output.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "refusing to write the output over the input model",
            ),
        });
    }
    let bytes = encode_graph(&model.graph, encoding)?;
    write_atomic(output, &bytes)?;
    Ok(bytes.len())
}

pub fn encode_graph(graph: &GraphDef, encoding: GraphEncoding) -> Result<Vec<u8>> {
    match encoding {
        GraphEncoding::Binary => graph.write_to_bytes().map_err(|source| Error::Encode {
            what: "GraphDef",
            source,
        }),
        GraphEncoding::Text => Ok(text::print(graph).into_bytes()),
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then a rename,
/// so a failed write never leaves a half-written file where a good one was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::InvalidOutput {
            path: path.to_owned(),
            reason: "the output path names no file".into(),
        })?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{file_name}.lode-tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io(source));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_told_from_binary_by_content() {
        assert!(as_text(b"# header\nnode { name: \"a\" }").is_some());
        assert!(
            as_text(b"\n\x05\n\x01a\x12\x01b").is_none(),
            "binary NodeDef bytes"
        );
        assert!(as_text(b"\xff\xfe").is_none());
        assert!(as_text(b"   ").is_none(), "no field name");
        assert!(
            as_text(b"{ }").is_none(),
            "does not start with a field name"
        );
    }

    #[test]
    fn text_kind_follows_the_first_field() {
        assert_eq!(text_kind("node {}"), Some(TextKind::GraphDef));
        assert_eq!(text_kind("# c\n  versions { }"), Some(TextKind::GraphDef));
        assert_eq!(text_kind("meta_info_def {}"), Some(TextKind::MetaGraph));
        assert_eq!(
            text_kind("saved_model_schema_version: 1"),
            Some(TextKind::SavedModel)
        );
        assert_eq!(text_kind("bogus: 1"), None);
    }

    #[test]
    fn writes_atomically_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.pb");
        write_atomic(&path, b"first").expect("write");
        write_atomic(&path, b"second").expect("overwrite");
        assert_eq!(fs::read(&path).expect("read"), b"second");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.pb")]);
        let missing_dir = dir.path().join("no/such/dir/out.pb");
        assert!(write_atomic(&missing_dir, b"x").is_err());
    }
}
