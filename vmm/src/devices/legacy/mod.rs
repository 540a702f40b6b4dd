//! The PC devices a Linux guest expects at fixed I/O ports: COM1 ([`serial`]) for the
//! console and an [`i8042`] whose reset line ends the VM.

pub mod i8042;
pub mod serial;
