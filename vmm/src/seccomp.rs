//! Seccomp filters for every thread of kata-vmm and kata-vsock, in Firecracker's style: each
//! thread may make only the system calls its job needs, and for the dangerous ones only with
//! the arguments it uses (`socket` only for `AF_UNIX` streams, `ioctl` only for the requests
//! the thread issues, `mmap`/`mprotect` never executable, `clone` only for threads, `fcntl`,
//! `prctl`, `madvise` and `tgkill` only for what the Rust and C runtimes do). Nothing opens a
//! path, executes a program or creates a non-local socket once a filter is on.
//!
//! A call outside a filter kills the whole process (`SECCOMP_RET_KILL_PROCESS`, seen as
//! SIGSYS by its parent): the process fails closed, and the parent sees it. A filter that
//! cannot be compiled or installed is an error that stops the program.
//!
//! Where the filters go:
//! - kata-vmm: the device thread and each vCPU thread install theirs first thing; the vCPUs
//!   then wait until the main thread has installed its own ([`Filter::VmmMain`]) before they
//!   run the guest, so no guest instruction runs while any thread is unfiltered.
//! - kata-vsock: one filter ([`Filter::Vsock`]) on the main thread after both sockets are
//!   bound and before any thread exists; the vhost-user threads inherit it.
//!
//! [`set_no_new_privs`] comes first in both programs (seccomp needs it without
//! CAP_SYS_ADMIN; it also makes exec'd set-uid programs useless).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Errors while building or installing a filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A rule could not be expressed.
    #[error("Cannot build the seccomp rules of the {0} filter: {1}; this is a bug in kata-vmm's filter tables")]
    Rule(&'static str, #[source] seccompiler::BackendError),
    /// The filter could not be compiled.
    #[error("Cannot compile the seccomp filter of the {0}: {1}; this is a bug in kata-vmm's filter tables")]
    Build(&'static str, #[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("Cannot install the seccomp filter of the {0}: {1}. The host kernel must support seccomp filters (CONFIG_SECCOMP_FILTER) and no outer seccomp profile (a container's) may forbid seccomp(2); the program does not run unfiltered")]
    Apply(&'static str, #[source] seccompiler::Error),
    /// PR_SET_NO_NEW_PRIVS failed.
    #[error("Cannot set no_new_privs (prctl PR_SET_NO_NEW_PRIVS): {0}; the program does not run without it")]
    NoNewPrivs(#[source] std::io::Error),
}

/// Which filter: one per kind of thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// A kata-vmm vCPU thread: KVM_RUN and the device models it calls into (MMIO and port
    /// I/O, virtio-fs's vhost-user control messages on a driver's DRIVER_OK or reset).
    Vcpu,
    /// The kata-vmm device thread: epoll over queue eventfds and host fds, the vsock muxer's
    /// unix sockets, virtio-blk's disk I/O, the tap's reads and writes.
    Device,
    /// The kata-vmm main thread once the VM runs: waits on the exit eventfd and the stop
    /// signals' signalfd, kicks vCPUs, logs.
    VmmMain,
    /// Every thread of kata-vsock: the vhost-user threads (control messages with fds, guest
    /// memory mappings) and the muxer (unix sockets, epoll), and starting those threads.
    Vsock,
}

impl Filter {
    /// What the filter is for, in messages.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Vcpu => "kata-vmm vCPU thread",
            Filter::Device => "kata-vmm device thread",
            Filter::VmmMain => "kata-vmm main thread",
            Filter::Vsock => "kata-vsock process",
        }
    }
}

// ioctl request numbers (asm-generic/ioctl.h: dir << 30 | size << 16 | type << 8 | nr).
const IOC_NONE: u64 = 0;
const IOC_READ: u64 = 2;
const KVMIO: u64 = 0xAE;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

/// `KVM_RUN`: `_IO(KVMIO, 0x80)`.
pub const KVM_RUN: u64 = ioc(IOC_NONE, 0x80, 0);
/// `KVM_GET_REGS`: `_IOR(KVMIO, 0x81, struct kvm_regs)`.
pub const KVM_GET_REGS: u64 = ioc(
    IOC_READ,
    0x81,
    std::mem::size_of::<kvm_bindings::kvm_regs>(),
);
/// `KVM_GET_MP_STATE`: `_IOR(KVMIO, 0x98, struct kvm_mp_state)`.
pub const KVM_GET_MP_STATE: u64 = ioc(
    IOC_READ,
    0x98,
    std::mem::size_of::<kvm_bindings::kvm_mp_state>(),
);

/// The flags glibc's `pthread_create` passes to clone(2) (clone3's ENOSYS makes it fall
/// back to clone, whose flags a filter can see): a thread, never a new process.
pub const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID) as u64;

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// Builds a filter's rule table, remembering the first error.
struct Table {
    filter: Filter,
    rules: Rules,
    error: Option<seccompiler::BackendError>,
}

/// One condition: argument `index` compared by `op` with `value`.
fn cond(
    index: u8,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value)
}

impl Table {
    fn new(filter: Filter) -> Self {
        Table {
            filter,
            rules: Rules::new(),
            error: None,
        }
    }

    /// Allows `nr` whatever its arguments.
    fn allow(&mut self, calls: &[libc::c_long]) -> &mut Self {
        for &nr in calls {
            self.rules.insert(nr, Vec::new());
        }
        self
    }

    /// Allows `nr` when one of `rules` (each a list of and-ed conditions) matches.
    fn allow_if(
        &mut self,
        nr: libc::c_long,
        rules: Vec<Vec<Result<SeccompCondition, seccompiler::BackendError>>>,
    ) -> &mut Self {
        let mut built = Vec::new();
        for conditions in rules {
            match conditions
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .and_then(SeccompRule::new)
            {
                Ok(rule) => built.push(rule),
                Err(e) => {
                    self.error.get_or_insert(e);
                }
            }
        }
        self.rules.entry(nr).or_default().extend(built);
        self
    }

    /// Allows `nr` when argument `index` equals one of `values`.
    fn allow_arg(&mut self, nr: libc::c_long, index: u8, values: &[u64]) -> &mut Self {
        let rules = values
            .iter()
            .map(|&v| vec![cond(index, SeccompCmpOp::Eq, v)])
            .collect();
        self.allow_if(nr, rules)
    }

    fn finish(self) -> Result<Rules, SeccompError> {
        match self.error {
            Some(e) => Err(SeccompError::Rule(self.filter.name(), e)),
            None => Ok(self.rules),
        }
    }
}

/// What every thread needs: memory (never executable), locks, signals, reading and writing
/// the fds it has, the time, its ids, exiting, and aborting on a panic.
fn common(t: &mut Table) {
    let no_exec = || {
        vec![vec![cond(
            2,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )]]
    };
    t.allow(&[
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_close,
        libc::SYS_futex,
        libc::SYS_munmap,
        libc::SYS_mremap,
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
        // std seeds a thread's HashMap keys with it.
        libc::SYS_getrandom,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_rseq,
    ])
    .allow_if(libc::SYS_mmap, no_exec())
    .allow_if(libc::SYS_mprotect, no_exec())
    // malloc's trims and a thread's exit give memory back; nothing else.
    .allow_arg(
        libc::SYS_madvise,
        2,
        &[libc::MADV_DONTNEED as u64, libc::MADV_FREE as u64],
    )
    // std's debug checks (F_GETFD), try_clone (F_DUPFD_CLOEXEC), flags.
    .allow_arg(
        libc::SYS_fcntl,
        1,
        &[
            libc::F_GETFD as u64,
            libc::F_SETFD as u64,
            libc::F_GETFL as u64,
            libc::F_SETFL as u64,
            libc::F_DUPFD_CLOEXEC as u64,
        ],
    )
    // Signals to our own threads only: vCPU kicks, abort() on a panic.
    .allow_arg(libc::SYS_tgkill, 0, &[u64::from(std::process::id())]);
}

/// A unix stream socket, and nothing else: `socket(AF_UNIX, SOCK_STREAM | flags, 0)`.
fn unix_stream_sockets(t: &mut Table) {
    const SOCK_TYPE_MASK: u64 = 0xf;
    t.allow_if(
        libc::SYS_socket,
        vec![vec![
            cond(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64),
            cond(
                1,
                SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK),
                libc::SOCK_STREAM as u64,
            ),
        ]],
    )
    .allow(&[
        libc::SYS_connect,
        libc::SYS_accept4,
        libc::SYS_recvfrom,
        libc::SYS_sendto,
        libc::SYS_shutdown,
    ]);
}

fn epoll(t: &mut Table) {
    t.allow(&[
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_ctl,
    ]);
}

/// The rule table of `filter`: system call number -> the argument rules it is allowed with
/// (an empty list: any arguments).
pub fn rules(filter: Filter) -> Result<Rules, SeccompError> {
    let mut t = Table::new(filter);
    common(&mut t);
    match filter {
        Filter::Vcpu => {
            // KVM_RUN, and KVM_GET_MP_STATE and KVM_GET_REGS to tell a guest halted for good.
            // irqfd and ioeventfd signals and the serial log are `write`s. A driver's
            // DRIVER_OK or reset of virtio-fs talks vhost-user to virtiofsd, passing memory
            // and eventfds (sendmsg/recvmsg with SCM_RIGHTS).
            t.allow_arg(
                libc::SYS_ioctl,
                1,
                &[KVM_RUN, KVM_GET_REGS, KVM_GET_MP_STATE],
            )
            .allow(&[libc::SYS_sendmsg, libc::SYS_recvmsg]);
        }
        Filter::Device => {
            // The vsock muxer: accepting host connections, dialling `<uds>_<port>`, its epoll
            // set, and `set_nonblocking` (FIONBIO). virtio-blk: positioned reads and writes
            // of the disk image, and flushes. The tap: read and write.
            epoll(&mut t);
            unix_stream_sockets(&mut t);
            t.allow_arg(libc::SYS_ioctl, 1, &[libc::FIONBIO]).allow(&[
                libc::SYS_pread64,
                libc::SYS_pwrite64,
                libc::SYS_fdatasync,
            ]);
        }
        Filter::VmmMain => {
            // poll(2) over the exit eventfd and the signalfd, reading them, kicking vCPUs.
            t.allow(&[libc::SYS_poll, libc::SYS_ppoll]);
        }
        Filter::Vsock => {
            epoll(&mut t);
            unix_stream_sockets(&mut t);
            t.allow(&[
                libc::SYS_epoll_create1,
                libc::SYS_eventfd2,
                // The vring worker polls a single descriptor now and then (seen killed on
                // poll(2) under load, syscall 7): reading readiness grants nothing.
                libc::SYS_poll,
                libc::SYS_ppoll,
                // vhost-user messages carry fds (guest memory, kick and call eventfds).
                libc::SYS_sendmsg,
                libc::SYS_recvmsg,
                // Starting the vhost-user threads: glibc sets its internal signal handlers on
                // the first one; the thread sets its name and looks up its stack.
                libc::SYS_rt_sigaction,
                libc::SYS_set_robust_list,
                libc::SYS_sched_getaffinity,
                // Refused with ENOSYS by the first program (see `programs`), so that glibc
                // falls back to clone(2), whose flags are checked here.
                libc::SYS_clone3,
            ])
            .allow_arg(libc::SYS_ioctl, 1, &[libc::FIONBIO])
            .allow_arg(libc::SYS_clone, 0, &[THREAD_CLONE_FLAGS])
            .allow_arg(libc::SYS_prctl, 0, &[libc::PR_SET_NAME as u64]);
        }
    }
    t.finish()
}

fn compile(
    filter: Filter,
    rules: Rules,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    SeccompFilter::new(rules, mismatch, matched, TargetArch::x86_64)
        .and_then(BpfProgram::try_from)
        .map_err(|e| SeccompError::Build(filter.name(), e))
}

/// The BPF programs of `filter`, in the order they are installed: for filters that start
/// threads, first a program that answers clone3(2) with ENOSYS (its argument is a struct no
/// filter can look into; glibc then uses clone(2)), then the allow-list, whose mismatch
/// kills the process. The allow-list comes last because installing a program calls
/// prctl(PR_SET_NO_NEW_PRIVS) first, which it does not allow.
pub fn programs(filter: Filter) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut programs = Vec::new();
    if filter == Filter::Vsock {
        let clone3: Rules = [(libc::SYS_clone3, Vec::new())].into_iter().collect();
        programs.push(compile(
            filter,
            clone3,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
        )?);
    }
    programs.push(compile(
        filter,
        rules(filter)?,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
    )?);
    Ok(programs)
}

/// Installs already compiled `programs` of `filter` on the calling thread (and the threads
/// it starts afterwards). Allocates nothing.
pub fn install(filter: Filter, programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for program in programs {
        seccompiler::apply_filter(program).map_err(|e| SeccompError::Apply(filter.name(), e))?;
    }
    Ok(())
}

/// Compiles and installs `filter` on the calling thread (and the threads it starts later).
pub fn apply(filter: Filter) -> Result<(), SeccompError> {
    install(filter, &programs(filter)?)
}

/// Sets `PR_SET_NO_NEW_PRIVS` on the calling thread (and the threads it starts later).
pub fn set_no_new_privs() -> Result<(), SeccompError> {
    // SAFETY: prctl with integer arguments only; the return value is checked.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(SeccompError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Filter; 4] = [Filter::Vcpu, Filter::Device, Filter::VmmMain, Filter::Vsock];

    #[test]
    fn every_filter_compiles() {
        for f in ALL {
            let programs = programs(f).unwrap();
            assert!(
                !programs.is_empty() && programs.iter().all(|p| !p.is_empty()),
                "{f:?}"
            );
        }
    }

    #[test]
    fn kvm_ioctl_numbers_are_the_kernels() {
        // From linux/kvm.h as compiled on x86_64.
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_GET_REGS, 0x8090_ae81);
        assert_eq!(KVM_GET_MP_STATE, 0x8004_ae98);
        assert_eq!(THREAD_CLONE_FLAGS, 0x3d0f00);
    }

    #[test]
    fn no_filter_allows_exec_open_or_process_creation() {
        for f in ALL {
            let r = rules(f).unwrap();
            for nr in [
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_open,
                libc::SYS_openat,
                libc::SYS_openat2,
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_ptrace,
                libc::SYS_bind,
                libc::SYS_unlink,
                libc::SYS_unlinkat,
                libc::SYS_mount,
                libc::SYS_pkey_mprotect,
            ] {
                assert!(!r.contains_key(&nr), "{f:?} allows syscall {nr}");
            }
            // socket, ioctl, mmap and mprotect are only allowed with argument checks.
            for nr in [
                libc::SYS_socket,
                libc::SYS_ioctl,
                libc::SYS_mmap,
                libc::SYS_mprotect,
                libc::SYS_clone,
            ] {
                if let Some(rules) = r.get(&nr) {
                    assert!(!rules.is_empty(), "{f:?} allows syscall {nr} unchecked");
                }
            }
        }
    }

    #[test]
    fn each_thread_gets_only_its_own_calls() {
        let vcpu = rules(Filter::Vcpu).unwrap();
        let device = rules(Filter::Device).unwrap();
        let main = rules(Filter::VmmMain).unwrap();
        assert!(!vcpu.contains_key(&libc::SYS_socket));
        assert!(!main.contains_key(&libc::SYS_ioctl));
        assert!(!main.contains_key(&libc::SYS_sendmsg));
        for nr in [libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_fdatasync] {
            assert!(device.contains_key(&nr), "syscall {nr}");
            assert!(!vcpu.contains_key(&nr), "syscall {nr}");
        }
        // Only kata-vsock starts threads once filtered.
        for f in [Filter::Vcpu, Filter::Device, Filter::VmmMain] {
            let r = rules(f).unwrap();
            assert!(!r.contains_key(&libc::SYS_clone) && !r.contains_key(&libc::SYS_clone3));
        }
    }
}
