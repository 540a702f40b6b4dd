//! `kata-vmm check`: can this host's KVM run kata-vmm at full speed, and if not, why not.
//!
//! It opens `/dev/kvm`, checks the capabilities the VMM needs, then times a test guest: a
//! counted loop in real mode ending in HLT. Hardware KVM runs it in well under a
//! millisecond; an emulated or badly nested KVM takes orders of magnitude longer.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_regs, kvm_userspace_memory_region};
use kvm_ioctls::{Cap, Kvm, VcpuExit};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Loop iterations of the test guest (two instructions each).
const LOOP_COUNT: u32 = 200_000;
/// Below this many guest instructions per second, KVM is not running at hardware speed.
const FULL_SPEED_INSTRUCTIONS_PER_SEC: f64 = 50e6;
const DEADLINE: Duration = Duration::from_secs(20);
const NEEDED_CAPS: [Cap; 6] = [
    Cap::Irqchip,
    Cap::Ioeventfd,
    Cap::Irqfd,
    Cap::UserMemory,
    Cap::SetTssAddr,
    Cap::Pit2,
];

/// The verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// KVM runs guests at hardware speed.
    FullSpeed {
        /// Measured guest instructions per second.
        rate: f64,
    },
    /// KVM works but slowly.
    Slow {
        /// Measured guest instructions per second (0 if the guest did not finish).
        rate: f64,
        /// Why.
        reason: String,
    },
    /// KVM cannot run kata-vmm at all.
    Unusable {
        /// Why.
        reason: String,
    },
}

impl Verdict {
    /// The process exit code for `kata-vmm check`: 0 full speed, 2 slow, 1 unusable.
    pub fn exit_code(&self) -> i32 {
        match self {
            Verdict::FullSpeed { .. } => 0,
            Verdict::Slow { .. } => 2,
            Verdict::Unusable { .. } => 1,
        }
    }

    /// A sentence for people.
    pub fn describe(&self) -> String {
        match self {
            Verdict::FullSpeed { rate } => format!(
                "KVM runs guests at full speed here ({:.0} M guest instructions/s): kata-vmm can be used.",
                rate / 1e6
            ),
            Verdict::Slow { rate, reason } => format!(
                "KVM works but not at full speed ({:.1} M guest instructions/s; hardware KVM does over {:.0} M/s): {reason} Small test guests run; a Linux guest will not boot in useful time. Use the QEMU backend with accel=tcg on this host.",
                rate / 1e6,
                FULL_SPEED_INSTRUCTIONS_PER_SEC / 1e6
            ),
            Verdict::Unusable { reason } => format!("kata-vmm cannot run here: {reason}"),
        }
    }
}

/// The test guest: `mov ecx, LOOP_COUNT; l: dec ecx; jnz l; hlt` (16-bit code).
fn guest_code() -> Vec<u8> {
    let mut code = vec![0x66, 0xb9];
    code.extend_from_slice(&LOOP_COUNT.to_le_bytes());
    code.extend_from_slice(&[0x66, 0x49, 0x75, 0xfc, 0xf4]);
    code
}

fn run_guest() -> Result<Duration, String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}."))?;
    if kvm.get_api_version() != 12 {
        return Err(format!(
            "KVM API version {} is not 12.",
            kvm.get_api_version()
        ));
    }
    if let Some(cap) = NEEDED_CAPS.iter().find(|c| !kvm.check_extension(**c)) {
        return Err(format!("KVM lacks the capability {cap:?}."));
    }
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)])
        .map_err(|e| format!("cannot allocate test guest memory: {e}."))?;
    use vm_memory::Bytes;
    mem.write_slice(&guest_code(), GuestAddress(0))
        .map_err(|e| format!("cannot write the test guest: {e}."))?;
    let host = mem
        .iter()
        .next()
        .map(|r| r.as_ptr() as u64)
        .ok_or("the test guest memory has no region.")?;
    let vm = kvm
        .create_vm()
        .map_err(|e| format!("KVM_CREATE_VM failed: {e}."))?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: 0x1000,
        userspace_addr: host,
        flags: 0,
    };
    // SAFETY: `mem` maps 0x1000 bytes at `host` and outlives `vm` (dropped at the end of
    // this function, after `vm` and `vcpu`, in reverse declaration order).
    unsafe { vm.set_user_memory_region(region) }
        .map_err(|e| format!("KVM_SET_USER_MEMORY_REGION failed: {e}."))?;
    let mut vcpu = vm
        .create_vcpu(0)
        .map_err(|e| format!("KVM_CREATE_VCPU failed: {e}."))?;
    let mut sregs = vcpu
        .get_sregs()
        .map_err(|e| format!("KVM_GET_SREGS failed: {e}."))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs)
        .map_err(|e| format!("KVM_SET_SREGS failed: {e}."))?;
    vcpu.set_regs(&kvm_regs {
        rip: 0,
        rflags: 2,
        ..Default::default()
    })
    .map_err(|e| format!("KVM_SET_REGS failed: {e}."))?;
    let started = Instant::now();
    loop {
        match vcpu.run() {
            Ok(VcpuExit::Hlt) => return Ok(started.elapsed()),
            Ok(VcpuExit::Intr) => continue,
            Ok(other) => return Err(format!("the test guest stopped with {other:?}.")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
            Err(e) => return Err(format!("KVM_RUN failed: {e}.")),
        }
    }
}

/// Runs the check. The test guest runs on its own thread; past the deadline it is abandoned
/// (the process is expected to exit soon after).
pub fn check() -> Verdict {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("kvm-check".into())
        .spawn(move || {
            let _ = tx.send(run_guest());
        });
    if let Err(e) = spawned {
        return Verdict::Unusable {
            reason: format!("cannot start the check thread: {e}."),
        };
    }
    match rx.recv_timeout(DEADLINE) {
        Ok(Ok(elapsed)) => {
            let rate = f64::from(LOOP_COUNT) * 2.0 / elapsed.as_secs_f64().max(1e-9);
            if rate >= FULL_SPEED_INSTRUCTIONS_PER_SEC {
                Verdict::FullSpeed { rate }
            } else {
                Verdict::Slow {
                    rate,
                    reason: "guest code is emulated instead of run natively, as under a nested KVM without hardware virtualisation.".into(),
                }
            }
        }
        Ok(Err(reason)) => Verdict::Unusable { reason },
        Err(_) => Verdict::Slow {
            rate: 0.0,
            reason: format!(
                "a {}-instruction test guest did not finish within {} s.",
                u64::from(LOOP_COUNT) * 2,
                DEADLINE.as_secs()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_exit_codes_and_text() {
        assert_eq!(Verdict::FullSpeed { rate: 1e9 }.exit_code(), 0);
        let slow = Verdict::Slow {
            rate: 1.3e6,
            reason: "emulated.".into(),
        };
        assert_eq!(slow.exit_code(), 2);
        assert!(slow.describe().contains("1.3 M"));
        assert_eq!(Verdict::Unusable { reason: "x".into() }.exit_code(), 1);
    }

    #[test]
    fn check_reaches_a_verdict_on_this_host() {
        if !std::path::Path::new("/dev/kvm").exists() {
            return;
        }
        let v = check();
        assert!(!matches!(v, Verdict::Unusable { .. }), "{}", v.describe());
    }
}
