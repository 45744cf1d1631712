//! A consumer log read back and held to the job's order: did every step arrive once, in
//! order, with the records the data order gives it, and no record twice in an epoch? This is
//! what `lode run` reports at its end, from the log the emulator wrote ([`crate::emulator`]).
//!
//! The order is the caller's (the dispatcher's `StepOrder`, which this crate does not depend
//! on): a function from (epoch, step within the epoch) to that step's records.

use std::collections::{BTreeMap, HashSet};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One line of the emulator's log, as read back.
#[derive(Debug, Deserialize)]
struct Line {
    epoch: u64,
    /// The global step.
    step: u64,
    records: Vec<u64>,
}

/// What a consumer log shows about delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Steps logged.
    pub steps: u64,
    /// Records delivered, over every step.
    pub records: u64,
    /// Records delivered in each epoch the log reaches.
    pub per_epoch: BTreeMap<u64, u64>,
    /// The first thing wrong, with the log's line number (1-based): a step out of order, a
    /// step whose records are not its records in the data order, a record twice in an epoch.
    /// `None` when every step held.
    pub problem: Option<String>,
}

impl Delivery {
    /// Every step in order with its own records, and no record twice in an epoch.
    pub fn exactly_once(&self) -> bool {
        self.problem.is_none()
    }
}

/// Why a log could not be read at all (a problem with what it says is a [`Delivery`]'s).
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("{}: cannot read the consumer log", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: not a consumer log line: {source}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads `path` and checks each step against `expected(epoch, step in epoch)`, the records
/// of that step in the job's order (`None`: the job has no such step). Steps of an epoch of
/// `per_epoch` steps are numbered globally in the log (`epoch · per_epoch + step`). The log
/// may start anywhere (a run resumed from a journal starts at its watermark); from there each
/// line must be the next step.
pub fn check_log(
    path: &Path,
    per_epoch: u64,
    expected: &mut dyn FnMut(u64, u64) -> Option<Vec<u64>>,
) -> Result<Delivery, DeliveryError> {
    let read = |source| DeliveryError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut delivery = Delivery::default();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut previous: Option<(u64, u64)> = None;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(read)?;
        let line: Line = serde_json::from_str(&line).map_err(|source| DeliveryError::Parse {
            path: path.to_owned(),
            line: number,
            source,
        })?;
        if delivery.problem.is_some() {
            continue;
        }
        delivery.problem = check_line(&line, per_epoch, previous, &mut seen, expected)
            .err()
            .map(|why| format!("line {number}: {why}"));
        previous = Some((line.epoch, line.step));
        delivery.steps += 1;
        let n = u64::try_from(line.records.len()).unwrap_or(u64::MAX);
        delivery.records += n;
        *delivery.per_epoch.entry(line.epoch).or_default() += n;
    }
    Ok(delivery)
}

/// The step's place after `previous`, its records against the order's, and its records not
/// seen before in its epoch (`seen` holds the epoch's so far, emptied when a new one begins).
fn check_line(
    line: &Line,
    per_epoch: u64,
    previous: Option<(u64, u64)>,
    seen: &mut HashSet<u64>,
    expected: &mut dyn FnMut(u64, u64) -> Option<Vec<u64>>,
) -> Result<(), String> {
    let (epoch, step) = (line.epoch, line.step);
    if let Some((_, before)) = previous {
        if step != before + 1 {
            return Err(format!("step {step} follows step {before}"));
        }
    }
    let first = epoch.checked_mul(per_epoch);
    let in_epoch = first
        .and_then(|first| step.checked_sub(first))
        .filter(|s| *s < per_epoch)
        .ok_or_else(|| format!("step {step} is not in epoch {epoch} ({per_epoch} steps each)"))?;
    let want = expected(epoch, in_epoch)
        .ok_or_else(|| format!("epoch {epoch} has no step {in_epoch} in the job's order"))?;
    if want != line.records {
        return Err(format!(
            "step {step} (epoch {epoch}) holds records {:?}, the order gives it {:?}",
            line.records, want
        ));
    }
    let fresh_epoch = previous.is_some_and(|(e, _)| e != epoch);
    if fresh_epoch {
        seen.clear();
    }
    for r in &line.records {
        if !seen.insert(*r) {
            return Err(format!("record {r} arrives twice in epoch {epoch}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// Two epochs of 3 steps of 2 records; epoch 1 is epoch 0 reversed.
    fn order(epoch: u64, step: u64) -> Option<Vec<u64>> {
        let batches = [[0, 1], [2, 3], [4, 5]];
        match epoch {
            0 => batches.get(usize::try_from(step).ok()?).map(|b| b.to_vec()),
            1 => batches
                .get(2usize.checked_sub(usize::try_from(step).ok()?)?)
                .map(|b| vec![b[1], b[0]]),
            _ => None,
        }
    }

    /// (epoch, global step, records) of one logged step.
    type LogLine<'a> = (u64, u64, &'a [u64]);

    fn log(lines: &[LogLine]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        for (epoch, step, records) in lines {
            writeln!(
                f,
                r#"{{"epoch":{epoch},"step":{step},"records":{records:?},"digest":"00"}}"#
            )
            .expect("write");
        }
        f
    }

    fn check(lines: &[LogLine]) -> Delivery {
        let f = log(lines);
        check_log(f.path(), 3, &mut order).expect("readable")
    }

    #[test]
    fn a_whole_run_in_order_is_exactly_once_and_counts_each_epoch() {
        let d = check(&[
            (0, 0, &[0, 1]),
            (0, 1, &[2, 3]),
            (0, 2, &[4, 5]),
            (1, 3, &[5, 4]),
            (1, 4, &[3, 2]),
        ]);
        assert!(d.exactly_once(), "{d:?}");
        assert_eq!((d.steps, d.records), (5, 10));
        assert_eq!(d.per_epoch, BTreeMap::from([(0, 6), (1, 4)]));
    }

    #[test]
    fn a_resumed_log_may_start_mid_epoch() {
        assert!(check(&[(0, 2, &[4, 5]), (1, 3, &[5, 4])]).exactly_once());
    }

    #[test]
    fn each_kind_of_wrong_delivery_is_named_with_its_line() {
        let cases: [(&[LogLine], &str); 5] = [
            (
                &[(0, 0, &[0, 1]), (0, 2, &[4, 5])],
                "line 2: step 2 follows step 0",
            ),
            (
                &[(0, 0, &[0, 1]), (0, 0, &[0, 1])],
                "line 2: step 0 follows step 0",
            ),
            (
                &[(0, 0, &[0, 1]), (0, 1, &[3, 2])],
                "line 2: step 1 (epoch 0) holds records [3, 2], the order gives it [2, 3]",
            ),
            (&[(0, 3, &[5, 4])], "line 1: step 3 is not in epoch 0"),
            (&[(2, 6, &[0, 1])], "line 1: epoch 2 has no step 0"),
        ];
        for (lines, want) in cases {
            let d = check(lines);
            let problem = d.problem.clone().unwrap_or_default();
            assert!(
                problem.starts_with(want),
                "{problem:?} should start {want:?}"
            );
            assert!(!d.exactly_once());
        }
    }

    #[test]
    fn a_record_twice_in_an_epoch_is_caught_even_where_the_order_repeats_it() {
        let f = log(&[(0, 0, &[0, 1]), (0, 1, &[1, 2])]);
        let mut repeating = |_: u64, step: u64| Some(vec![step, step + 1]);
        let d = check_log(f.path(), 3, &mut repeating).expect("readable");
        assert_eq!(
            d.problem.as_deref(),
            Some("line 2: record 1 arrives twice in epoch 0")
        );
        // The same records in the next epoch are not twice.
        let f = log(&[(0, 2, &[2, 3]), (1, 3, &[2, 3])]);
        let mut same = |_: u64, _: u64| Some(vec![2, 3]);
        assert!(check_log(f.path(), 3, &mut same)
            .expect("readable")
            .exactly_once());
    }

    #[test]
    fn an_unreadable_line_is_an_error_naming_the_file_and_line() {
        let mut f = log(&[(0, 0, &[0, 1])]);
        writeln!(f, "not json").expect("write");
        let err = check_log(f.path(), 3, &mut order).expect_err("refused");
        assert!(
            err.to_string().contains(":2: not a consumer log line: "),
            "{err}"
        );
        let missing = check_log(Path::new("/nonexistent/log.jsonl"), 3, &mut order);
        assert!(matches!(missing, Err(DeliveryError::Read { .. })));
    }
}
