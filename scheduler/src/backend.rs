//! The one interface between the policies and whatever runs the workers.
//!
//! A backend turns its world (simulated machines now; local processes and Kubernetes later)
//! into a [`Snapshot`] and carries out [`Decision`]s. The policy in between is the same pure
//! [`decide`] everywhere, so the simulator exercises exactly the code a live scheduler runs.

use crate::policy::{decide, DecideConfig, Decision, Policy, Snapshot};

/// Something that runs data workers.
pub trait Backend {
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for logs ("simulator", "local", "kubernetes").
    fn name(&self) -> &'static str;

    /// The current cluster state and each job's queue metrics.
    fn snapshot(&mut self) -> Result<Snapshot, Self::Error>;

    /// Carries out decisions in order: removals, then migrations, then additions. A backend
    /// that cannot start a worker skips it; the next round sees the shortfall.
    fn apply(&mut self, decisions: &[Decision]) -> Result<(), Self::Error>;
}

/// One scheduling round: snapshot, decide, apply. Returns what was decided.
pub fn round<B: Backend + ?Sized>(
    backend: &mut B,
    policy: Policy,
    config: &DecideConfig,
) -> Result<Vec<Decision>, B::Error> {
    let snapshot = backend.snapshot()?;
    let decisions = decide(policy, &snapshot, config);
    backend.apply(&decisions)?;
    Ok(decisions)
}
