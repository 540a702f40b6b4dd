//! Architecture-specific setup of the guest: memory layout, boot protocol structures and
//! the initial vCPU state. Only x86_64 is supported.

pub mod x86_64;
