//! One step of a job in both of its numberings: `(epoch, step within the epoch)`, as the
//! dispatcher leases it and the protocol's `StepRef` message carries it, and the global step
//! (`epoch · steps_per_epoch + step`), as frames, the receiver and the training side count.
//!
//! Every conversion between the two goes through [`StepRef`], with one overflow policy: a
//! step whose global number does not fit in a `u64`, or a step within the epoch at or past the
//! epoch's length, is an error ([`StepError`]), never a wrapped or clamped number.

use std::fmt;
use std::num::NonZeroU64;

#[cfg(feature = "service")]
use crate::service::v1;

/// A step of a job, both numberings at once (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepRef {
    /// The global step: `epoch · steps_per_epoch + in_epoch`. Orders like the pair.
    pub global: u64,
    pub epoch: u64,
    /// The step within its epoch (`< steps_per_epoch`).
    pub in_epoch: u64,
}

/// A step that has no global number in a job of `per_epoch` steps an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("step {in_epoch} of epoch {epoch} is past the epoch's {per_epoch} steps")]
    PastEpoch {
        epoch: u64,
        in_epoch: u64,
        per_epoch: u64,
    },
    #[error("step {in_epoch} of epoch {epoch} has no global number below 2^64 ({per_epoch} steps an epoch)")]
    Overflow {
        epoch: u64,
        in_epoch: u64,
        per_epoch: u64,
    },
    #[error("a job cannot have 0 steps an epoch")]
    EmptyEpoch,
}

/// Steps an epoch, checked to be above 0 once.
pub fn steps_per_epoch(n: u64) -> Result<NonZeroU64, StepError> {
    NonZeroU64::new(n).ok_or(StepError::EmptyEpoch)
}

impl StepRef {
    /// The step of global number `global` (always exists).
    pub fn from_global(global: u64, per_epoch: NonZeroU64) -> StepRef {
        StepRef {
            global,
            epoch: global / per_epoch,
            in_epoch: global % per_epoch,
        }
    }

    /// Step `in_epoch` of `epoch`, checked.
    pub fn new(epoch: u64, in_epoch: u64, per_epoch: NonZeroU64) -> Result<StepRef, StepError> {
        let per = per_epoch.get();
        if in_epoch >= per {
            return Err(StepError::PastEpoch {
                epoch,
                in_epoch,
                per_epoch: per,
            });
        }
        let global = epoch
            .checked_mul(per)
            .and_then(|g| g.checked_add(in_epoch))
            .ok_or(StepError::Overflow {
                epoch,
                in_epoch,
                per_epoch: per,
            })?;
        Ok(StepRef {
            global,
            epoch,
            in_epoch,
        })
    }

    /// The protocol's `(epoch, step)` message, checked.
    #[cfg(feature = "service")]
    pub fn from_wire(wire: v1::StepRef, per_epoch: NonZeroU64) -> Result<StepRef, StepError> {
        StepRef::new(wire.epoch, wire.step, per_epoch)
    }

    /// The protocol's `(epoch, step)` message.
    #[cfg(feature = "service")]
    pub fn to_wire(self) -> v1::StepRef {
        v1::StepRef {
            epoch: self.epoch,
            step: self.in_epoch,
        }
    }

    /// The step after this one, if it has a number.
    pub fn next(self, per_epoch: NonZeroU64) -> Option<StepRef> {
        Some(StepRef::from_global(self.global.checked_add(1)?, per_epoch))
    }
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} (epoch {}, step {} of it)",
            self.global, self.epoch, self.in_epoch
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn per(n: u64) -> NonZeroU64 {
        steps_per_epoch(n).expect("above 0")
    }

    #[test]
    fn both_numberings_agree() {
        let s = StepRef::new(2, 3, per(10)).expect("in range");
        assert_eq!(s.global, 23);
        assert_eq!(StepRef::from_global(23, per(10)), s);
        #[cfg(feature = "service")]
        {
            assert_eq!(s.to_wire(), v1::StepRef { epoch: 2, step: 3 });
            assert_eq!(StepRef::from_wire(s.to_wire(), per(10)), Ok(s));
        }
        assert_eq!(s.next(per(10)).map(|n| (n.epoch, n.in_epoch)), Some((2, 4)));
        assert_eq!(
            StepRef::new(2, 9, per(10))
                .expect("last")
                .next(per(10))
                .map(|n| (n.epoch, n.in_epoch)),
            Some((3, 0))
        );
    }

    #[test]
    fn out_of_range_steps_are_errors_never_wrapped() {
        assert!(matches!(
            StepRef::new(0, 10, per(10)),
            Err(StepError::PastEpoch { .. })
        ));
        assert!(matches!(
            StepRef::new(u64::MAX, 0, per(2)),
            Err(StepError::Overflow { .. })
        ));
        assert!(matches!(
            StepRef::new(u64::MAX / 2 + 1, 0, per(2)),
            Err(StepError::Overflow { .. })
        ));
        // The last numbered step still has its number.
        assert_eq!(
            StepRef::new(u64::MAX / 2, 1, per(2)).map(|s| s.global),
            Ok(u64::MAX)
        );
        assert_eq!(steps_per_epoch(0), Err(StepError::EmptyEpoch));
        assert_eq!(StepRef::from_global(u64::MAX, per(1)).next(per(1)), None);
        let err = StepRef::new(0, 10, per(10)).expect_err("past").to_string();
        assert!(err.contains("step 10 of epoch 0"), "{err}");
    }

    proptest! {
        #[test]
        fn global_round_trips_and_orders_like_the_pair(
            a in any::<u64>(), b in any::<u64>(), n in 1u64..1_000_000,
        ) {
            let (sa, sb) = (StepRef::from_global(a, per(n)), StepRef::from_global(b, per(n)));
            prop_assert_eq!(StepRef::new(sa.epoch, sa.in_epoch, per(n)), Ok(sa));
            prop_assert_eq!(
                sa.global.cmp(&sb.global),
                (sa.epoch, sa.in_epoch).cmp(&(sb.epoch, sb.in_epoch))
            );
        }
    }
}
