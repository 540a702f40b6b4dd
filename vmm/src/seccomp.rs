//! Seccomp filters for the VMM's threads: each thread may make only the system calls its
//! job needs. A filter that cannot be installed (an old kernel, or a container without
//! seccomp) is logged and skipped rather than fatal.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

/// Errors while building or installing a filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter could not be compiled.
    #[error("Cannot compile the seccomp filter of the {0} thread: {1}")]
    Build(&'static str, #[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("Cannot install the seccomp filter of the {0} thread: {1}")]
    Apply(&'static str, #[source] seccompiler::Error),
}

/// Which thread a filter is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU thread: KVM_RUN and the device models it calls into.
    Vcpu,
    /// The device thread: epoll over queue eventfds, virtio device work.
    Device,
}

impl ThreadKind {
    fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::Device => "device",
        }
    }
}

/// Calls every thread needs: memory, locks, signals, writing logs, exiting.
const COMMON: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    // std's debug builds check that a borrowed fd is open with fcntl(F_GETFD).
    libc::SYS_fcntl,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_restart_syscall,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_rseq,
];

/// The allowed system calls of `kind`.
pub fn allowed_syscalls(kind: ThreadKind) -> Vec<libc::c_long> {
    let mut calls = COMMON.to_vec();
    match kind {
        // KVM_RUN, KVM_GET_REGS, KVM_GET_MP_STATE; irqfd and ioeventfd writes are `write`.
        // A driver's DRIVER_OK or reset of virtio-fs talks vhost-user to virtiofsd, passing
        // memory and eventfds (sendmsg/recvmsg with SCM_RIGHTS).
        ThreadKind::Vcpu => calls.extend([libc::SYS_ioctl, libc::SYS_sendmsg, libc::SYS_recvmsg]),
        // The vsock muxer: accepting and connecting unix sockets, its epoll set, and
        // `set_nonblocking` (an ioctl). virtio-blk: positioned reads and writes of the disk
        // image, and flushes.
        ThreadKind::Device => calls.extend([
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_epoll_ctl,
            libc::SYS_getrandom,
            libc::SYS_accept,
            libc::SYS_accept4,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            libc::SYS_shutdown,
            libc::SYS_getsockopt,
            libc::SYS_setsockopt,
            libc::SYS_ioctl,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_fdatasync,
        ]),
    }
    calls
}

/// Compiles the filter of `kind`: anything not allowed kills the process with SIGSYS.
pub fn filter(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls(kind)
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| SeccompError::Build(kind.name(), e))?;
    filter
        .try_into()
        .map_err(|e| SeccompError::Build(kind.name(), e))
}

/// Installs the filter of `kind` on the calling thread.
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    let program = filter(kind)?;
    seccompiler::apply_filter(&program).map_err(|e| SeccompError::Apply(kind.name(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        assert!(!filter(ThreadKind::Vcpu).unwrap().is_empty());
        assert!(!filter(ThreadKind::Device).unwrap().is_empty());
        assert!(!allowed_syscalls(ThreadKind::Vcpu).contains(&libc::SYS_execve));
        // virtio-blk's file I/O runs on the device thread.
        let device = allowed_syscalls(ThreadKind::Device);
        for nr in [libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_fdatasync] {
            assert!(device.contains(&nr), "syscall {nr}");
        }
    }
}
