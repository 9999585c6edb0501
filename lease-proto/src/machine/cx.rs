//! What a component borrows from the machine to act ([`Cx`]): the options,
//! the run table, the deadlines, the outputs, the connector's ids and the
//! send plan. A component owns its state and handles its own inputs and
//! replies through it; the dispatch (`mod.rs`, `pump.rs`) lends it.

use super::deadline::DeadlineTable;
use super::knobs::Knobs;
use super::outputs::Outputs;
use super::plan::SendPlan;
use super::runs::RunTable;
use super::session::Connector;
use crate::options::Options;

/// The machine's shared parts, lent to a component for one call.
pub(super) struct Cx<'a> {
    pub(super) opts: &'a Options,
    /// The simulator's broken variants (all off in production).
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(super) knobs: &'a Knobs,
    pub(super) runs: &'a mut RunTable,
    pub(super) timers: &'a mut DeadlineTable,
    pub(super) out: &'a mut Outputs,
    pub(super) connector: &'a mut Connector,
    pub(super) plan: &'a mut SendPlan,
}
