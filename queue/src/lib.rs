//! The broker protocol between gateway, workers, controller and billing.
