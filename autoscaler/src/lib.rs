//! The autoscaling policy (pure) and the trace-replay simulator that measures it.
//!
//! The policy ([`decide`]) is one pure function of observed metrics, the model's
//! [`ScalingSpec`], its own [`PolicyState`] and an injected clock. The Kubernetes controller,
//! the local fleet of `tidal up` and the simulator ([`sim`]) all call it, so what the simulator
//! measures is what production runs.

pub mod capacity;
pub mod observed;
pub mod policy;
pub mod pool;
pub mod prefill;
pub mod schedule;
pub mod signals;
pub mod sim;
pub mod spec;
pub mod telemetry;
pub mod window;

pub use capacity::Split;
pub use observed::{CapacityObserved, Observed};
pub use policy::{decide, decide_at, Decision, PolicyState, Reason};
pub use schedule::FloorWindow;
pub use signals::{condition_signal, taint_signal, InterruptionSource};
pub use spec::{CapacityMode, ScaleDownHold, ScalingSpec, SpecError, StableAggregate};
