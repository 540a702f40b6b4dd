//! Runs a built VM: confines every thread (seccomp) before the guest's first instruction,
//! starts the device thread and one thread per vCPU, then waits on the main thread for the
//! guest's exit or a stop signal, kicking the vCPUs now and then.

use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread::JoinHandle;

use crate::builder::Vmm;
use crate::error::{os_err, VmmError};
use crate::logger::log;
use crate::seccomp::{self, Filter, SeccompError};
use crate::signals::{StopSignals, Wake};
use crate::vstate::exit::ExitReason;
use crate::vstate::vcpu::{install_kick_handler, kick_signal, VcpuContext};

/// How often the main thread kicks vCPUs so that a single vCPU halted with interrupts off
/// is noticed.
const HALT_CHECK_INTERVAL_MS: i32 = 1000;

impl Vmm {
    /// Runs the VM until it ends; returns why.
    pub fn run(self) -> Result<ExitReason, VmmError> {
        let Vmm {
            vcpus,
            vm,
            memory,
            io_bus,
            mmio_bus,
            notifier,
            exit,
            seccomp,
            ready_file,
            cmdline: _,
        } = self;
        if !seccomp {
            log(
                "warn",
                "seccomp is off (\"seccomp\": false in vmm.json): the VMM's threads run unfiltered",
            );
        }
        let signals = StopSignals::block()?;
        install_kick_handler().map_err(os_err("install the vCPU kick handler"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = VcpuContext {
            io_bus,
            mmio_bus,
            exit: exit.clone(),
            stop: stop.clone(),
            cpu_count: vcpus.len() as u8,
        };

        // Each thread installs its filter first thing and says whether it could; the vCPUs
        // then wait at `go` until the main thread is filtered too, so the guest never runs
        // while a thread of ours is unfiltered. A filter that fails ends the VMM.
        let (confined_tx, confined_rx) = mpsc::channel::<Result<(), SeccompError>>();
        let go = Arc::new(Barrier::new(vcpus.len() + 1));
        let confined = confined_tx.clone();
        std::thread::Builder::new()
            .name("kata-vmm-dev".into())
            .spawn(move || {
                let result = confine(seccomp, Filter::Device);
                let ok = result.is_ok();
                let _ = confined.send(result);
                if ok {
                    let e = notifier.run();
                    log("error", &e.to_string());
                }
            })
            .map_err(os_err("start the device thread"))?;

        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        for mut vcpu in vcpus {
            let ctx = ctx.clone();
            let confined = confined_tx.clone();
            let go = go.clone();
            let name = format!("kata-vmm-vcpu{}", vcpu.id());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let result = confine(seccomp, Filter::Vcpu);
                    let ok = result.is_ok();
                    let _ = confined.send(result);
                    if ok {
                        go.wait();
                        vcpu.run(&ctx);
                    }
                })
                .map_err(os_err("start a vCPU thread"))?;
            threads.push(handle);
        }
        drop(confined_tx);
        for _ in 0..=threads.len() {
            confined_rx.recv().map_err(|_| VmmError::Os {
                what: "start the VM's threads",
                source: std::io::Error::other("a thread ended before it was confined"),
            })??;
        }
        if let Some(path) = &ready_file {
            std::fs::write(path, format!("{}\n", std::process::id()))
                .map_err(os_err("write the ready file"))?;
        }
        // Nothing is opened from here on.
        if let Err(e) = confine(seccomp, Filter::VmmMain) {
            if let Some(path) = &ready_file {
                let _ = std::fs::remove_file(path);
            }
            return Err(e.into());
        }
        go.wait();
        log("info", "the VM is running");

        let reason = loop {
            match signals.wait(exit.eventfd(), HALT_CHECK_INTERVAL_MS)? {
                Wake::Exit => {
                    if let Some(reason) = exit.reason() {
                        break reason;
                    }
                }
                Wake::Signal(signo) => {
                    break ExitReason {
                        code: 0,
                        message: format!("stopped by signal {signo}"),
                    }
                }
                Wake::Timeout => kick_all(&threads),
            }
        };
        stop.store(true, Ordering::Release);
        kick_all(&threads);
        // The vCPU threads are not joined: one may be blocked in KVM_RUN for a while, and the
        // process exits right after this anyway. The VM and memory stay alive until then.
        std::mem::forget(vm);
        std::mem::forget(memory);
        Ok(reason)
    }
}

/// Installs `filter` on the calling thread unless vmm.json turned seccomp off.
fn confine(enabled: bool, filter: Filter) -> Result<(), SeccompError> {
    if enabled {
        seccomp::apply(filter)?;
    }
    Ok(())
}

fn kick_all(threads: &[JoinHandle<()>]) {
    for t in threads {
        if t.is_finished() {
            continue;
        }
        // SAFETY: the thread has not been joined (we hold its handle), so its pthread_t is
        // valid; the kick signal has a do-nothing handler installed.
        unsafe { libc::pthread_kill(t.as_pthread_t(), kick_signal()) };
    }
}
