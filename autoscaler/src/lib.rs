//! The autoscaling policy (pure) and the trace-replay simulator that measures it.
