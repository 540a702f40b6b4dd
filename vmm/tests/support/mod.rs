//! What the VM integration tests share.

pub mod confinement;
