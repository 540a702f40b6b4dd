//! A test guest for `/dev/kvm`: a counted loop in real mode, then HLT.
//!
//! It first checks the KVM API version and the capabilities kata-vmm needs, then runs the
//! guest on its own thread. If it has not reached HLT by the deadline, the thread is kicked
//! out of `KVM_RUN` with `immediate_exit` plus a signal ([`kick_signal`]), and the loop
//! counter left in `ecx` says how far it got, so even a slow KVM gets a measured rate.
//! Nothing here may hang the caller.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_regs, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit};

use super::verdict::GuestRun;

/// Iterations of the guest loop: about 10 M instructions, a few ms on real KVM and
/// seconds on an emulated one.
const LOOP_COUNT: u32 = 5_000_000;
const PAGE: usize = 4096;

/// The signal that kicks the probe's vCPU out of `KVM_RUN`. SIGRTMIN+0 is left to the
/// builtin VMM's vCPU threads (as in Firecracker); this one is private to the probe.
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

/// The guest: `mov ecx, LOOP_COUNT; l: dec ecx; jnz l; hlt` (16-bit code).
fn guest_code() -> Vec<u8> {
    let mut code = vec![0x66, 0xb9];
    code.extend_from_slice(&LOOP_COUNT.to_le_bytes());
    code.extend_from_slice(&[0x66, 0x49, 0x75, 0xfc, 0xf4]);
    code
}

/// The probe thread's `kvm_run` mapping while its vCPU exists, so the caller can set
/// `immediate_exit`. Cleared (under the lock) before the vCPU is dropped.
#[derive(Default)]
struct RunHandle(Mutex<Option<NonNull<u8>>>);

// SAFETY: the pointer is only dereferenced while the mutex is held, and the owning thread
// clears it under the same mutex before unmapping, so it is never used after unmap.
unsafe impl Send for RunHandle {}
// SAFETY: as above; all access goes through the mutex.
unsafe impl Sync for RunHandle {}

/// Runs the test guest for at most about `deadline`; `Err` if it could not run at all.
pub(super) fn run_probe_guest(deadline: Duration) -> Result<GuestRun, String> {
    install_kick_handler();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let run = Arc::new(RunHandle::default());
    let (tx, rx) = mpsc::channel();
    let thread = {
        let (stop, run) = (stop.clone(), run.clone());
        std::thread::Builder::new()
            .name("kvm-probe".into())
            .spawn(move || {
                let _ = tx.send(guest_thread(&stop, &run));
            })
            .map_err(|e| format!("cannot start the probe thread: {e}"))?
    };
    if let Ok(result) = rx.recv_timeout(deadline) {
        let _ = thread.join();
        return result;
    }
    stop.store(true, Ordering::SeqCst);
    let pthread = std::os::unix::thread::JoinHandleExt::as_pthread_t(&thread);
    // Kick until the thread notices; bounded so that a wedged ioctl cannot hang us.
    for _ in 0..50 {
        if let Ok(guard) = run.0.lock() {
            if let Some(immediate_exit) = *guard {
                // SAFETY: the mapping is alive while the pointer is set (see RunHandle);
                // a volatile byte store is how KVM expects immediate_exit to be set.
                unsafe { immediate_exit.as_ptr().write_volatile(1) };
            }
        }
        // SAFETY: `pthread` belongs to a thread that has not been joined or detached yet
        // (we still own its JoinHandle), so the id is valid.
        unsafe { libc::pthread_kill(pthread, kick_signal()) };
        if let Ok(result) = rx.recv_timeout(Duration::from_millis(10)) {
            let _ = thread.join();
            return result;
        }
    }
    // The thread is wedged in KVM_RUN; it is left behind (the process exits soon after a
    // check, and the shim only probes once per boot).
    Err(format!(
        "the test guest could not be stopped {} ms after it started",
        started.elapsed().as_millis()
    ))
}

/// Opens `/dev/kvm` and checks what kata-vmm and QEMU need of it.
fn open_kvm() -> Result<Kvm, String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}."))?;
    super::check_requirements(&kvm).map_err(|e| e.to_string())?;
    Ok(kvm)
}

fn guest_thread(stop: &AtomicBool, run: &RunHandle) -> Result<GuestRun, String> {
    // SAFETY: unblocking a signal in the calling thread's own mask has no memory effects.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, kick_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    // Declared before the VM so that, on every return path, it is unmapped last.
    let memory = GuestPage::new()?;
    memory.write(&guest_code());
    let kvm = open_kvm()?;
    let vm = kvm
        .create_vm()
        .map_err(|e| format!("KVM_CREATE_VM failed: {e}"))?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: PAGE as u64,
        userspace_addr: memory.addr() as u64,
        flags: 0,
    };
    // SAFETY: the region is a private anonymous mapping of PAGE bytes owned by `memory`,
    // which is dropped after the vCPU and the VM on every path (declaration order and the
    // explicit drops at the end).
    unsafe { vm.set_user_memory_region(region) }
        .map_err(|e| format!("KVM_SET_USER_MEMORY_REGION failed: {e}"))?;
    let mut vcpu = vm
        .create_vcpu(0)
        .map_err(|e| format!("KVM_CREATE_VCPU failed: {e}"))?;
    let mut sregs = vcpu
        .get_sregs()
        .map_err(|e| format!("KVM_GET_SREGS failed: {e}"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs)
        .map_err(|e| format!("KVM_SET_SREGS failed: {e}"))?;
    vcpu.set_regs(&kvm_regs {
        rip: 0,
        rflags: 2,
        ..Default::default()
    })
    .map_err(|e| format!("KVM_SET_REGS failed: {e}"))?;

    if let Ok(mut guard) = run.0.lock() {
        *guard = NonNull::new(&mut vcpu.get_kvm_run().immediate_exit as *mut u8);
    }
    let entered = Instant::now();
    let result = loop {
        if stop.load(Ordering::SeqCst) {
            let elapsed = entered.elapsed();
            break vcpu
                .get_regs()
                .map(|regs| GuestRun {
                    instructions: executed(regs.rcx),
                    elapsed,
                    finished: false,
                })
                .map_err(|e| format!("KVM_GET_REGS failed: {e}"));
        }
        match vcpu.run() {
            Ok(VcpuExit::Hlt) => {
                break Ok(GuestRun {
                    instructions: executed(0),
                    elapsed: entered.elapsed(),
                    finished: true,
                })
            }
            Ok(VcpuExit::Intr) => continue,
            Ok(other) => break Err(format!("the test guest exited with {other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
            Err(e) => break Err(format!("KVM_RUN failed: {e}")),
        }
    };
    if let Ok(mut guard) = run.0.lock() {
        *guard = None;
    }
    drop(vcpu);
    drop(vm);
    drop(memory);
    result
}

/// Guest instructions executed when the loop counter reads `rcx`: the `mov`, then a `dec`
/// and a `jnz` per iteration done.
fn executed(rcx: u64) -> u64 {
    let remaining = u64::from(rcx as u32).min(u64::from(LOOP_COUNT));
    1 + 2 * (u64::from(LOOP_COUNT) - remaining)
}

/// One page of anonymous memory as guest RAM.
struct GuestPage(NonNull<libc::c_void>);

impl GuestPage {
    fn new() -> Result<Self, String> {
        // SAFETY: an anonymous private mapping touches no existing memory; the result is
        // checked against MAP_FAILED before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!(
                "cannot map guest memory: {}",
                std::io::Error::last_os_error()
            ));
        }
        NonNull::new(addr)
            .map(Self)
            .ok_or_else(|| "mmap returned null".to_string())
    }

    fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }

    fn write(&self, bytes: &[u8]) {
        let len = bytes.len().min(PAGE);
        // SAFETY: the mapping is PAGE bytes, writable, and owned by self; len <= PAGE.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.as_ptr().cast(), len) };
    }
}

impl Drop for GuestPage {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.0.as_ptr(), PAGE) };
    }
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Installs a no-op handler for the kick signal (once), unless the process already
/// handles it; any handler makes `KVM_RUN` return `EINTR`, which is all the kick needs.
fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a zeroed struct queries the current disposition; the
        // handler installed is async-signal-safe (it does nothing).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(kick_signal(), std::ptr::null(), &mut old) != 0 {
                return;
            }
            if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
                return;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_kick as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(kick_signal(), &action, std::ptr::null_mut());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_code_is_a_counted_loop_ending_in_hlt() {
        let code = guest_code();
        assert_eq!(&code[..2], &[0x66, 0xb9]);
        assert_eq!(code.last(), Some(&0xf4));
        // jnz jumps back onto `dec ecx` (offset 6): next ip 10 + (-4).
        assert_eq!(code[6..10], [0x66, 0x49, 0x75, 0xfc]);
    }

    #[test]
    fn executed_counts_the_iterations_done() {
        assert_eq!(executed(0), 1 + 2 * u64::from(LOOP_COUNT));
        assert_eq!(executed(u64::from(LOOP_COUNT)), 1);
        assert_eq!(executed(u64::from(LOOP_COUNT) - 10), 21);
        // Only ecx is the counter; garbage above bit 31 is ignored.
        assert_eq!(executed((1 << 40) | u64::from(LOOP_COUNT)), 1);
    }

    #[test]
    fn probe_returns_within_bounds() {
        let started = Instant::now();
        let result = run_probe_guest(Duration::from_millis(250));
        eprintln!("probe: {result:?} after {:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(2), "{result:?}");
        let openable = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        if openable {
            let run = result.expect("/dev/kvm opens, so the test guest should run");
            assert!(run.instructions >= 1, "{run:?}");
        } else {
            crate::test_skip::skipped("needs a /dev/kvm it can open for the run assertion");
        }
    }
}
