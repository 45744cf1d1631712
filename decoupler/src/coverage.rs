//! Kernel coverage of feature-pipeline constructs (issue 14, item 2): for each construct
//! graph (`fixtures/constructs/<name>/model.pb`, one small training graph per construct,
//! written by `fixtures/gen/constructs.py`), whether the kernel-aware cut keeps its whole data
//! side on the data worker, or which ops limited the cut, how many nodes each kept in
//! training, and where the cut then falls (the tensors that cross).
//!
//! The data worker's kernels come in as `Options::kernels`, as for `decouple`; reading the
//! construct index and the graphs is the caller's (`lode kernels --coverage`).
//!
//! A construct whose data side does not run natively must be one of [`EXCEPTIONS`], each with
//! its reason; [`Report::problems`] names every construct that is neither native nor excepted,
//! and every exception that no longer applies (so the list cannot go stale).

use serde::{Deserialize, Serialize};

use crate::partition::Options;
use crate::{decouple, Result};
use lode_proto::view::GraphView;

/// One construct of the index (`constructs.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Construct {
    pub name: String,
    /// `feature_column`, `keras`, `strings`, `ragged_sparse`, `segments`, `math`, `optimizer`.
    pub group: String,
    /// What the graph exercises.
    pub what: String,
}

/// The construct index as `fixtures/gen/constructs.py` writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ConstructIndex {
    pub tensorflow: String,
    pub constructs: Vec<Construct>,
}

/// A construct whose data side is knowingly not all native, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exception {
    pub construct: &'static str,
    /// The ops that limit the cut, sorted.
    pub ops: &'static [&'static str],
    pub reason: &'static str,
}

/// Constructs whose data side stays partly in training, with the reason. Kept exact: a
/// construct that becomes native, or is limited by other ops, is reported by
/// [`Report::problems`].
pub static EXCEPTIONS: &[Exception] = &[];

/// An op that limited one construct's cut.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limit {
    pub op: String,
    /// Nodes kept in training because of the op.
    pub kept_in_training: usize,
    /// That count over the data side before the cut was limited.
    pub share_of_data_side: f64,
}

/// One construct's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConstructCoverage {
    pub name: String,
    pub group: String,
    /// The whole data side runs on the data worker.
    pub native: bool,
    /// Nodes in data-worker stages.
    pub stage_nodes: usize,
    /// The ops that limited the cut, by op name.
    pub limits: Vec<Limit>,
    /// Where the cut falls: the tensors the stages send to training.
    pub crossing: Vec<String>,
    /// The documented reason when the construct is an exception.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception: Option<&'static str>,
}

/// Cuts one construct graph and says whether its data side runs natively.
pub fn check(
    construct: &Construct,
    graph: &GraphView,
    options: &Options,
) -> Result<ConstructCoverage> {
    let decoupled = decouple(graph, options)?;
    let plan = &decoupled.plan;
    let limits: Vec<Limit> = plan
        .kernel_limits
        .iter()
        .map(|l| Limit {
            op: l.op.clone(),
            kept_in_training: l.kept_in_training,
            share_of_data_side: l.share_of_data_side,
        })
        .collect();
    let crossing = plan
        .stages
        .iter()
        .flat_map(|s| s.send.tensors.iter().map(|t| t.tensor.clone()))
        .collect();
    let exception = EXCEPTIONS
        .iter()
        .find(|e| e.construct == construct.name)
        .map(|e| e.reason);
    Ok(ConstructCoverage {
        name: construct.name.clone(),
        group: construct.group.clone(),
        native: limits.is_empty() && !plan.stages.is_empty(),
        stage_nodes: plan.stages.iter().map(|s| s.nodes.len()).sum(),
        limits,
        crossing,
        exception,
    })
}

/// Cuts every construct graph of `dir` (its `constructs.json` index, a `NAME/model.pb` each)
/// and gives the report; errors name the file.
pub fn check_dir(dir: &std::path::Path, options: &Options) -> Result<Report> {
    let read = |path: std::path::PathBuf| {
        std::fs::read(&path).map_err(|source| crate::Error::Io { path, source })
    };
    let index_path = dir.join("constructs.json");
    let index: ConstructIndex =
        serde_json::from_slice(&read(index_path.clone())?).map_err(|e| crate::Error::Output {
            path: index_path,
            reason: format!("not a construct index: {e}"),
        })?;
    let mut verdicts = Vec::with_capacity(index.constructs.len());
    for construct in &index.constructs {
        let path = dir.join(&construct.name).join("model.pb");
        let bytes = read(path.clone())?;
        let in_file = |source: crate::Error| crate::Error::InFile {
            path: path.clone(),
            source: Box::new(source),
        };
        let view = GraphView::parse(&bytes).map_err(|e| {
            in_file(crate::Error::InvalidGraph {
                reason: format!("not a valid binary GraphDef: {e}"),
            })
        })?;
        verdicts.push(check(construct, &view, options).map_err(in_file)?);
    }
    Ok(Report::new(verdicts))
}

/// Every construct's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub constructs: Vec<ConstructCoverage>,
    /// Native constructs over all, in percent.
    pub native_percent: f64,
    /// What fails the check (see [`Report::problems`]).
    pub problems: Vec<String>,
}

impl Report {
    /// Sums up the verdicts and checks them against [`EXCEPTIONS`].
    pub fn new(constructs: Vec<ConstructCoverage>) -> Self {
        let native = constructs.iter().filter(|c| c.native).count();
        #[allow(clippy::cast_precision_loss)] // counts of constructs
        let native_percent = if constructs.is_empty() {
            0.0
        } else {
            100.0 * native as f64 / constructs.len() as f64
        };
        let problems = problems(&constructs);
        Report {
            constructs,
            native_percent,
            problems,
        }
    }

    /// The text table `lode kernels --coverage` prints.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for c in &self.constructs {
            if c.native {
                let _ = writeln!(
                    out,
                    "native     {:<34} {:>3} stage nodes, {} crossing tensor(s)",
                    c.name,
                    c.stage_nodes,
                    c.crossing.len()
                );
                continue;
            }
            let ops: Vec<String> = c
                .limits
                .iter()
                .map(|l| {
                    format!(
                        "{} ({} node(s), {:.0}% of the data side)",
                        l.op,
                        l.kept_in_training,
                        100.0 * l.share_of_data_side
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "{}  {:<34} limited by {}",
                if c.exception.is_some() {
                    "EXCEPTION"
                } else {
                    "PARTIAL  "
                },
                c.name,
                ops.join(", ")
            );
            let _ = writeln!(
                out,
                "           {:<34} the cut then falls at: {}",
                "",
                c.crossing.join(", ")
            );
            if let Some(reason) = c.exception {
                let _ = writeln!(out, "           {:<34} why: {reason}", "");
            }
        }
        let native = self.constructs.iter().filter(|c| c.native).count();
        let _ = writeln!(
            out,
            "\n{native} of {} constructs run natively ({:.1}%); {} documented exception(s)",
            self.constructs.len(),
            self.native_percent,
            self.constructs
                .iter()
                .filter(|c| c.exception.is_some())
                .count()
        );
        for p in &self.problems {
            let _ = writeln!(out, "PROBLEM: {p}");
        }
        out
    }
}

/// Constructs neither native nor excepted (or limited by other ops than excepted), and
/// exceptions that no longer apply.
fn problems(constructs: &[ConstructCoverage]) -> Vec<String> {
    let mut out = Vec::new();
    for c in constructs {
        let mut ops: Vec<&str> = c.limits.iter().map(|l| l.op.as_str()).collect();
        ops.sort_unstable();
        let exception = EXCEPTIONS.iter().find(|e| e.construct == c.name);
        match (c.native, exception) {
            (true, None) => {}
            (true, Some(_)) => out.push(format!(
                "{}: runs natively now; remove its exception",
                c.name
            )),
            (false, None) if ops.is_empty() => {
                out.push(format!("{}: the plan has no data-worker stage", c.name));
            }
            (false, None) => out.push(format!(
                "{}: limited by {} (not a documented exception)",
                c.name,
                ops.join(", ")
            )),
            (false, Some(e)) if e.ops != ops.as_slice() => out.push(format!(
                "{}: limited by {}, but its exception names {}",
                c.name,
                ops.join(", "),
                e.ops.join(", ")
            )),
            (false, Some(_)) => {}
        }
    }
    for e in EXCEPTIONS {
        if !constructs.iter().any(|c| c.name == e.construct) {
            out.push(format!("exception {}: no such construct", e.construct));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(name: &str, limits: &[&str]) -> ConstructCoverage {
        ConstructCoverage {
            name: name.into(),
            group: "math".into(),
            native: limits.is_empty(),
            stage_nodes: 3,
            limits: limits
                .iter()
                .map(|op| Limit {
                    op: (*op).into(),
                    kept_in_training: 2,
                    share_of_data_side: 0.5,
                })
                .collect(),
            crossing: vec!["a:0".into()],
            exception: None,
        }
    }

    #[test]
    fn a_limited_construct_without_an_exception_is_a_problem() {
        let report = Report::new(vec![verdict("one", &[]), verdict("two", &["Foo"])]);
        assert!((report.native_percent - 50.0).abs() < 1e-9);
        assert_eq!(
            report.problems,
            vec!["two: limited by Foo (not a documented exception)".to_owned()]
        );
        let text = report.text();
        assert!(text.contains("PARTIAL    two"), "{text}");
        assert!(
            text.contains("Foo (2 node(s), 50% of the data side)"),
            "{text}"
        );
        assert!(
            text.contains("1 of 2 constructs run natively (50.0%)"),
            "{text}"
        );
    }

    #[test]
    fn all_native_has_no_problems() {
        let report = Report::new(vec![verdict("one", &[])]);
        assert!(report.problems.is_empty());
        assert!((report.native_percent - 100.0).abs() < 1e-9);
    }

    #[test]
    fn exceptions_name_their_ops_sorted_and_a_reason() {
        for e in EXCEPTIONS {
            assert!(!e.reason.is_empty(), "{}", e.construct);
            assert!(!e.ops.is_empty(), "{}", e.construct);
            assert!(e.ops.windows(2).all(|w| w[0] < w[1]), "{}", e.construct);
        }
    }
}
