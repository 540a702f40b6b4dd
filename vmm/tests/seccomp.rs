//! The seccomp filters of kata-vsock and kata-vmm, each in a child process: a call the
//! filter forbids kills the child with SIGSYS, and what the program does lets it live.
//!
//! The children are this test binary started again with `VMM_SECCOMP_TEST_CHILD=<filter>/
//! <action>`, running only the ignored `child` test: it installs the filter exactly as the
//! program does (`vmm::seccomp::apply`), does the action, and exits 0 if it is still alive.
//! The last test runs the real kata-vsock binary.

mod support;
use support::confinement;

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vmm::seccomp::{self, Filter, KVM_GET_MP_STATE, KVM_RUN};

const CHILD_ENV: &str = "VMM_SECCOMP_TEST_CHILD";

fn filter_named(name: &str) -> Filter {
    match name {
        "vsock" => Filter::Vsock,
        "vcpu" => Filter::Vcpu,
        "device" => Filter::Device,
        "main" => Filter::VmmMain,
        other => panic!("unknown filter {other}"),
    }
}

/// The return value of a libc call, or the panic message with errno.
fn check(what: &str, rc: libc::c_long) -> libc::c_long {
    if rc < 0 {
        panic!("{what}: {}", std::io::Error::last_os_error());
    }
    rc
}

/// What kata-vsock and kata-vmm's device thread do once filtered: dial a unix socket (bound
/// before the filter, as the programs bind theirs first), accept, send and receive, wait on
/// an epoll set (made before the filter too), FIONBIO, fcntl, memory.
fn unix_socket_work(listener: &UnixListener, path: &std::path::Path, ep: &OwnedFd) {
    let dialled = UnixStream::connect(path).expect("connect");
    dialled.set_nonblocking(true).expect("FIONBIO");
    let (mut accepted, _) = listener.accept().expect("accept");
    (&dialled).write_all(b"ping").expect("send");
    let mut buf = [0u8; 4];
    accepted.read_exact(&mut buf).expect("recv");
    assert_eq!(&buf, b"ping");
    let _clone = dialled.try_clone().expect("F_DUPFD_CLOEXEC");
    // SAFETY: plain syscalls on fds we own; results checked.
    unsafe {
        let ep = ep.as_raw_fd();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        check(
            "epoll_ctl",
            libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, accepted.as_raw_fd(), &mut ev).into(),
        );
        check("epoll_wait", libc::epoll_wait(ep, &mut ev, 1, 0).into());
    }
    let big: Vec<u8> = vec![7; 8 << 20];
    assert_eq!(
        big.iter().map(|&b| usize::from(b)).sum::<usize>(),
        7 * (8 << 20)
    );
}

/// Runs `action` under `filter`, in this (child) process.
fn run_child(filter: Filter, action: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).expect("bind before the filter");
    let (pipe_r, _pipe_w) = {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds we then own.
        check(
            "pipe2",
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }.into(),
        );
        // SAFETY: both fds were just created and are owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    };
    // SAFETY: epoll_create1 returns a new fd we then own, or -1 (checked).
    let ep = unsafe {
        OwnedFd::from_raw_fd(check(
            "epoll_create1",
            libc::epoll_create1(libc::EPOLL_CLOEXEC).into(),
        ) as i32)
    };
    let passwd = CString::new("/etc/passwd").expect("cstring");
    let truth = CString::new("/bin/true").expect("cstring");
    let argv = [truth.as_ptr(), std::ptr::null()];

    seccomp::set_no_new_privs().expect("no_new_privs");
    seccomp::apply(filter).expect("install the filter");

    // SAFETY (every block below): raw syscalls with valid pointers or constant arguments;
    // the point is whether the filter lets them through.
    match action {
        "inet-socket" => unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        },
        "unix-dgram-socket" => unsafe {
            libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0);
        },
        "open-passwd" => unsafe {
            libc::open(passwd.as_ptr(), libc::O_RDONLY);
        },
        "execve" => unsafe {
            libc::execv(truth.as_ptr(), argv.as_ptr());
        },
        "fork" => unsafe {
            libc::fork();
        },
        "exec-mapping" => unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
        },
        "tiocgwinsz" => unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            libc::ioctl(pipe_r.as_raw_fd(), libc::TIOCGWINSZ, &mut ws);
        },
        "kvm-create-vm" => unsafe {
            // KVM_CREATE_VM = _IO(KVMIO, 0x01): no vCPU thread issues it.
            libc::ioctl(pipe_r.as_raw_fd(), 0xae01, 0);
        },
        "kvm-run" => unsafe {
            // Not a KVM fd: ENOTTY, but the filter lets the requests through.
            assert_eq!(libc::ioctl(pipe_r.as_raw_fd(), KVM_RUN as _, 0), -1);
            let mut mp = [0u32; 1];
            assert_eq!(
                libc::ioctl(pipe_r.as_raw_fd(), KVM_GET_MP_STATE as _, mp.as_mut_ptr()),
                -1
            );
        },
        "unix-work" => unix_socket_work(&listener, &path, &ep),
        "threads" => {
            // kata-vsock starts its vhost-user threads after its filter is on.
            let t = std::thread::Builder::new()
                .name("worker".into())
                .spawn(|| 42)
                .expect("spawn a thread under the filter");
            assert_eq!(t.join().expect("join"), 42);
        }
        "poll" => unsafe {
            let mut fds = [libc::pollfd {
                fd: pipe_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            libc::poll(fds.as_mut_ptr(), 1, 0);
        },
        other => panic!("unknown action {other}"),
    }
    // Still alive: the filter let the action through.
    // SAFETY: _exit ends the process at once (no harness output, no destructors).
    unsafe { libc::_exit(0) };
}

/// The entry point of the children; it does nothing unless started by `run_under`.
#[test]
#[ignore = "helper: runs only in the child processes the other tests start"]
fn child() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (filter, action) = spec.split_once('/').expect("filter/action");
        run_child(filter_named(filter), action);
    }
}

/// Starts a child that does `action` under `filter`; its exit status and stderr.
fn run_under(filter: &str, action: &str) -> (ExitStatus, String) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{filter}/{action}"))
        .stdin(Stdio::null())
        .output()
        .expect("start the child");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_killed(filter: &str, action: &str) {
    let (status, stderr) = run_under(filter, action);
    assert_eq!(
        status.signal(),
        Some(libc::SIGSYS),
        "the {filter} filter should kill the process on {action}; it ended with {status}: {stderr}"
    );
}

fn assert_allowed(filter: &str, action: &str) {
    let (status, stderr) = run_under(filter, action);
    assert_eq!(
        status.code(),
        Some(0),
        "the {filter} filter should allow {action}; the child ended with {status}: {stderr}"
    );
}

#[test]
fn vsock_filter_kills_an_inet_socket() {
    assert_killed("vsock", "inet-socket");
}

#[test]
fn vsock_filter_kills_opening_etc_passwd() {
    assert_killed("vsock", "open-passwd");
}

#[test]
fn vsock_filter_kills_execve() {
    assert_killed("vsock", "execve");
}

#[test]
fn vsock_filter_kills_fork_exec_mappings_and_other_ioctls() {
    assert_killed("vsock", "fork");
    assert_killed("vsock", "exec-mapping");
    assert_killed("vsock", "tiocgwinsz");
    assert_killed("vsock", "unix-dgram-socket");
}

#[test]
fn vsock_filter_allows_what_kata_vsock_does() {
    assert_allowed("vsock", "unix-work");
    assert_allowed("vsock", "threads");
}

#[test]
fn vmm_device_filter_allows_unix_sockets_only() {
    assert_allowed("device", "unix-work");
    assert_killed("device", "inet-socket");
    assert_killed("device", "open-passwd");
    assert_killed("device", "threads");
}

#[test]
fn vmm_vcpu_filter_allows_only_its_kvm_ioctls() {
    assert_allowed("vcpu", "kvm-run");
    assert_killed("vcpu", "kvm-create-vm");
    assert_killed("vcpu", "unix-work");
    assert_killed("vcpu", "execve");
}

#[test]
fn vmm_main_filter_allows_waiting_and_nothing_else() {
    assert_allowed("main", "poll");
    assert_killed("main", "kvm-run");
    assert_killed("main", "unix-work");
    assert_killed("main", "open-passwd");
}

/// Kills and reaps a child by pid when the test ends, however it ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The real binary: every thread (main, vring worker, vhost-user handler) is filtered with
/// NoNewPrivs while a frontend is connected and host connections come and go, and when the
/// frontend leaves it exits 0, not killed by its own filter on the way out.
#[test]
fn kata_vsock_filters_every_thread_and_exits_cleanly_under_its_filter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vhost = dir.path().join("vhost-vsock.sock");
    let uds = dir.path().join("kata.hvsock");
    let log = dir.path().join("kata-vsock.log");
    let child = Command::new(env!("CARGO_BIN_EXE_kata-vsock"))
        .arg("--vm")
        .arg(format!(
            "guest-cid=3,socket={},uds-path={}",
            vhost.display(),
            uds.display()
        ))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start kata-vsock");
    let mut backend = Reaper(child);
    let pid = backend.0.id();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("kata-vsock never listened", || {
        vhost.exists() && uds.exists()
    });

    // The file exists from bind(2) on, connections succeed from listen(2) on.
    let mut frontend = None;
    wait_until("cannot connect to kata-vsock's vhost-user socket", || {
        frontend = UnixStream::connect(&vhost).ok();
        frontend.is_some()
    });
    // Host connections: one asking for a guest port (kept until the guest answers), one
    // sending garbage (dropped): the muxer's paths run on the vring worker.
    let mut early = UnixStream::connect(&uds).expect("hybrid connect");
    early.write_all(b"CONNECT 1024\n").expect("CONNECT");
    let mut junk = UnixStream::connect(&uds).expect("hybrid connect");
    junk.write_all(b"nonsense\n").expect("junk");
    wait_until("the vhost-user handler thread never started", || {
        confinement::thread_statuses(pid).len() >= 3
    });
    confinement::assert_every_thread_filtered(pid, 3);

    drop(frontend);
    let mut status = None;
    wait_until("kata-vsock did not exit after its frontend left", || {
        status = backend.0.try_wait().expect("try_wait");
        status.is_some()
    });
    let status = status.expect("status");
    assert_eq!(
        status.code(),
        Some(0),
        "kata-vsock ended with {status}: {}",
        log_text()
    );
}
