//! Test guests, assembled and linked with binutils at test time.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Assembles `source` (GNU as, AT&T syntax) and links it at 1 MiB into `dir/name`.
pub fn build_guest(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.S"));
    let obj = dir.join(format!("{name}.o"));
    let elf = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let status = Command::new("as")
        .args(["--64", "-o"])
        .arg(&obj)
        .arg(&src)
        .status()
        .expect("binutils' `as` must be installed");
    assert!(status.success(), "as failed on {name}");
    let status = Command::new("ld")
        .args([
            "-m",
            "elf_x86_64",
            "-nostdlib",
            "-static",
            "-Ttext=0x100000",
            "-e",
            "_start",
            "-o",
        ])
        .arg(&elf)
        .arg(&obj)
        .status()
        .expect("binutils' `ld` must be installed");
    assert!(status.success(), "ld failed on {name}");
    elf
}

/// Serial helpers shared by the guests: `puts` prints the NUL-terminated string at
/// (%rbx or %ebx), `hex32` prints %eax as 8 hex digits, `hex8` %al as 2. They clobber
/// %eax/%ecx/%edx (the hex ones %esi too).
pub const SERIAL_HELPERS: &str = r#"
puts:
    mov $0x3f8, %dx
1:  movb (%ebx), %al
    test %al, %al
    jz 2f
    out %al, %dx
    inc %ebx
    jmp 1b
2:  ret

hex8:
    shl $24, %eax
    mov $2, %ecx
    jmp hex_digits
hex32:
    mov $8, %ecx
hex_digits:
    mov %eax, %esi
    mov $0x3f8, %dx
3:  rol $4, %esi
    mov %esi, %eax
    and $0xf, %eax
    cmp $10, %al
    jb 4f
    add $('a' - 10 - '0'), %al
4:  add $'0', %al
    out %al, %dx
    dec %ecx
    jnz 3b
    ret

reset:
    mov $0xfe, %al
    out %al, $0x64
5:  hlt
    jmp 5b
"#;

/// Assembly that brings up the virtio-mmio device at `base` as a driver does: ACKNOWLEDGE,
/// DRIVER, accepts `features` (VERSION_1 is bit 32), FEATURES_OK, sets up `queues` queues of
/// 8 entries (queue q: descriptor table at 0x200000 + q * 0x4000, available ring 0x1000 and
/// used ring 0x2000 above it), then DRIVER_OK.
pub fn virtio_bring_up(base: u32, features: u64, queues: u32) -> String {
    let reg = |offset: u32| format!("{:#x}", base + offset);
    let mut asm = format!(
        "    movl $1, {status}\n    movl $3, {status}\n",
        status = reg(0x70)
    );
    for (select, word) in [(0u32, features as u32), (1, (features >> 32) as u32)] {
        asm += &format!(
            "    movl ${select}, {}\n    movl ${word:#x}, {}\n",
            reg(0x24),
            reg(0x20)
        );
    }
    asm += &format!("    movl $11, {}\n", reg(0x70));
    for q in 0..queues {
        let desc = 0x200000 + q * 0x4000;
        asm += &format!(
            "    movl ${q}, {}\n    movl $8, {}\n    movl ${desc:#x}, {}\n    \
             movl ${:#x}, {}\n    movl ${:#x}, {}\n    movl $1, {}\n",
            reg(0x30),
            reg(0x38),
            reg(0x80),
            desc + 0x1000,
            reg(0x90),
            desc + 0x2000,
            reg(0xa0),
            reg(0x44)
        );
    }
    asm + &format!("    movl $15, {}\n", reg(0x70))
}

/// Assembly that offers queue 0 (as set up by [`virtio_bring_up`]) `count` device-writable
/// buffers of `1 << shift` bytes at 0x210000 and up, one descriptor each, and notifies the
/// device at `base`. Clobbers %eax, %ecx, %edi.
pub fn post_rx_buffers(base: u32, count: u32, shift: u32) -> String {
    format!(
        r#"    xor %ecx, %ecx
1:  mov %ecx, %eax
    shl ${shift}, %eax
    add $0x210000, %eax
    mov %ecx, %edi
    shl $4, %edi
    mov %eax, 0x200000(%edi)
    movl $0, 0x200004(%edi)
    movl ${size}, 0x200008(%edi)
    movw $2, 0x20000c(%edi)
    movw $0, 0x20000e(%edi)
    movw %cx, 0x201004(,%ecx,2)
    inc %ecx
    cmp ${count}, %ecx
    jne 1b
    movw ${count}, 0x201002
    movl $0, {notify:#x}
"#,
        size = 1u32 << shift,
        notify = base + 0x50
    )
}

/// 64-bit Linux boot protocol guest: checks EFER.LMA, prints "LM ", the e820 entry count
/// from the zero page (at %rsi), then the command line at the zero page's cmd_line_ptr,
/// then resets through the i8042.
pub fn linux64_cmdline_guest() -> String {
    format!(
        r#"
    .code64
    .text
    .globl _start
_start:
    mov %rsi, %rdi
    mov $0xc0000080, %ecx
    rdmsr
    bt $10, %eax
    jnc no_long_mode
    lea msg_lm(%rip), %rbx
    call puts
    movzbl 0x1e8(%rdi), %eax
    call hex32
    mov $' ', %al
    out %al, %dx
    mov $'[', %al
    out %al, %dx
    mov 0x228(%rdi), %ebx
    call puts
    mov $']', %al
    out %al, %dx
    mov $'\n', %al
    out %al, %dx
    jmp reset
no_long_mode:
    lea msg_nolm(%rip), %rbx
    call puts
    jmp reset
{SERIAL_HELPERS}
msg_lm: .asciz "LM e820="
msg_nolm: .asciz "NOT IN LONG MODE\n"
"#
    )
}

/// The smallest guest: reset through the i8042 right away.
pub fn reset_guest() -> String {
    r#"
    .code64
    .text
    .globl _start
_start:
    mov $0xfe, %al
    out %al, $0x64
1:  hlt
    jmp 1b
"#
    .to_string()
}

/// A guest that triple-faults: `ud2` with an IDT too short to hold any vector.
pub fn triple_fault_guest() -> String {
    r#"
    .code64
    .text
    .globl _start
_start:
    mov $0x3f8, %dx
    mov $'T', %al
    out %al, %dx
    ud2
1:  jmp 1b
"#
    .to_string()
}

/// A guest that prints "H" and halts with interrupts disabled.
pub fn cli_hlt_guest() -> String {
    r#"
    .code64
    .text
    .globl _start
_start:
    mov $0x3f8, %dx
    mov $'H', %al
    out %al, %dx
    cli
1:  hlt
    jmp 1b
"#
    .to_string()
}

/// A PVH guest (32-bit protected mode, `%ebx` = hvm_start_info) that checks the start info
/// magic, prints the command line from it, reads the first virtio-mmio device's
/// identification registers, then drives a virtio-rng request through queue 0 and prints the
/// length the device reports in the used ring.
pub fn pvh_virtio_guest() -> String {
    format!(
        r#"
{PVH_START}    mov %ebx, %edi
    cmpl $0x336ec578, (%edi)
    jne bad_magic
    lea msg_pvh, %ebx
    call puts
    mov 24(%edi), %ebx
    call puts
    lea msg_magic, %ebx
    call puts
    mov 0xd0000000, %eax
    call hex32
    lea msg_version, %ebx
    call puts
    mov 0xd0000004, %eax
    call hex32
    lea msg_id, %ebx
    call puts
    mov 0xd0000008, %eax
    call hex32

{bring_up}    lea msg_status, %ebx
    call puts
    mov 0xd0000070, %eax
    call hex32
    # one device-writable 16-byte buffer at 0x203000
    movl $0x203000, 0x200000
    movl $0, 0x200004
    movl $16, 0x200008
    movw $2, 0x20000c
    movw $0, 0x20000e
    movw $0, 0x201000
    movw $0, 0x201004
    movw $1, 0x201002
    movl $0, 0xd0000050
    mov $2000000, %ecx
wait_used:
    cmpw $1, 0x202002
    je used
    dec %ecx
    jnz wait_used
    lea msg_timeout, %ebx
    call puts
    jmp reset
used:
    lea msg_used, %ebx
    call puts
    mov 0x202008, %eax
    call hex32
    mov $'\n', %al
    out %al, %dx
    jmp reset
bad_magic:
    lea msg_bad, %ebx
    call puts
    jmp reset
{SERIAL_HELPERS}
msg_pvh: .asciz "PVH cmdline="
msg_magic: .asciz " magic="
msg_version: .asciz " version="
msg_id: .asciz " id="
msg_status: .asciz " status="
msg_used: .asciz " rng-used-len="
msg_timeout: .asciz " rng-timeout\n"
msg_bad: .asciz "BAD PVH MAGIC\n"

    .section .note.Xen, "a", @note
    .align 4
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .align 4
    .quad _start
"#,
        bring_up = virtio_bring_up(0xd000_0000, 1 << 32, 1),
    )
}

/// PVH guest (paging off, so the MMIO gap above the 1 GiB identity map is reachable) that
/// prints the device id and the config space (guest CID, low word) of the second
/// virtio-mmio device, then resets.
pub fn vsock_probe_guest() -> String {
    format!(
        r#"
{PVH_START}    lea msg_id, %ebx
    call puts
    mov 0xd0001008, %eax
    call hex32
    lea msg_cid, %ebx
    call puts
    mov 0xd0001100, %eax
    call hex32
    mov $'\n', %al
    out %al, %dx
    jmp reset
{SERIAL_HELPERS}
msg_id: .asciz "vsock id="
msg_cid: .asciz " cid="
{PVH_NOTE}
"#
    )
}

/// The start of a PVH guest: 32-bit code at `_start`, with a stack below the zero page
/// (PVH provides none) and string operations counting up.
pub const PVH_START: &str = r#"
    .code32
    .text
    .globl _start
_start:
    mov $0x8ff0, %esp
    cld
"#;

/// The ELF note that announces a PVH entry at `_start`.
pub const PVH_NOTE: &str = r#"
    .section .note.Xen, "a", @note
    .align 4
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .align 4
    .quad _start
"#;

/// PVH guest that drives virtio-vsock (second device, CID 3) by hand: sets up rx (8 buffers)
/// and tx queues, waits for a connection REQUEST to port 1024, answers RESPONSE, sends
/// "hello from guest\n", then prints the payload of the first RW packet it receives as
/// "got: ..." and resets.
pub fn vsock_echo_guest() -> String {
    format!(
        r#"
{PVH_START}{bring_up}    # rx descriptors i = 0..7: 4 KiB device-writable buffers at 0x210000 + i * 4 KiB
{rx_buffers}    lea msg_ready, %ebx
    call puts

    call next_rx
    cmpw $1, 30(%edi)
    jne fail
    cmpl $1024, 20(%edi)
    jne fail
    mov 16(%edi), %eax
    mov %eax, host_port

    # tx desc 0: RESPONSE header; desc 1 -> 2: RW header + payload
    mov $0x220000, %edi
    mov $2, %eax
    xor %ecx, %ecx
    call make_hdr
    mov $0x220100, %edi
    mov $5, %eax
    mov $(msg_hello_end - msg_hello), %ecx
    call make_hdr
    lea msg_hello, %esi
    mov $0x220200, %edi
    rep movsb
    movl $0x220000, 0x204000
    movl $0, 0x204004
    movl $44, 0x204008
    movw $0, 0x20400c
    movl $0x220100, 0x204010
    movl $0, 0x204014
    movl $44, 0x204018
    movw $1, 0x20401c
    movw $2, 0x20401e
    movl $0x220200, 0x204020
    movl $0, 0x204024
    movl $(msg_hello_end - msg_hello), 0x204028
    movw $0, 0x20402c
    movw $0, 0x205004
    movw $1, 0x205006
    movw $2, 0x205002
    movl $1, 0xd0001050

    # wait for data from the host
2:  call next_rx
    cmpw $3, 30(%edi)
    je fail
    cmpw $5, 30(%edi)
    jne 2b
    lea msg_got, %ebx
    call puts
    mov 24(%edi), %ecx
    lea 44(%edi), %ebx
    mov $0x3f8, %dx
3:  test %ecx, %ecx
    jz 4f
    movb (%ebx), %al
    out %al, %dx
    inc %ebx
    dec %ecx
    jmp 3b
4:  jmp reset

fail:
    lea msg_fail, %ebx
    call puts
    jmp reset

# Waits for the next used rx entry; returns its buffer in %edi.
next_rx:
    movzwl rx_last, %eax
5:  cmpw %ax, 0x202002
    je 5b
    mov %eax, %ecx
    and $7, %ecx
    mov 0x202004(,%ecx,8), %edx
    shl $12, %edx
    lea 0x210000(%edx), %edi
    inc %eax
    mov %ax, rx_last
    ret

# Writes a stream header at %edi: op %ax, payload length %ecx, guest port 1024.
make_hdr:
    movl $3, 0(%edi)
    movl $0, 4(%edi)
    movl $2, 8(%edi)
    movl $0, 12(%edi)
    movl $1024, 16(%edi)
    mov host_port, %edx
    mov %edx, 20(%edi)
    mov %ecx, 24(%edi)
    movw $1, 28(%edi)
    movw %ax, 30(%edi)
    movl $0, 32(%edi)
    movl $65536, 36(%edi)
    movl $0, 40(%edi)
    ret
{SERIAL_HELPERS}
rx_last: .word 0
    .align 4
host_port: .long 0
msg_ready: .asciz "vsock ready\n"
msg_got: .asciz "got: "
msg_fail: .asciz "vsock FAILED\n"
msg_hello: .ascii "hello from guest\n"
msg_hello_end:
{PVH_NOTE}
"#,
        bring_up = virtio_bring_up(0xd000_1000, 1 << 32, 2),
        rx_buffers = post_rx_buffers(0xd000_1000, 8, 12),
    )
}

/// PVH guest that drives virtio-fs (first device) by hand through virtiofsd: sets up the
/// high-priority and request queues, then FUSE_INIT, LOOKUP of `hello.txt` in the root,
/// OPEN and READ, printing each reply's error and finally the file's contents, then resets.
pub fn virtio_fs_guest() -> String {
    format!(
        r#"
{PVH_START}    # queue 0: high priority, queue 1: requests
{bring_up}    lea msg_status, %ebx
    call puts
    mov 0xd0000070, %eax
    call hex32

    # FUSE_INIT 7.31
    mov $56, %eax
    mov $26, %ecx
    xor %edx, %edx
    call fuse_hdr
    movl $7, 0x210028
    movl $31, 0x21002c
    movl $0x20000, 0x210030
    movl $0, 0x210034
    call fuse_call
    lea msg_init, %ebx
    call print_error
    lea msg_major, %ebx
    call puts
    mov 0x220010, %eax
    call hex32

    # FUSE_LOOKUP "hello.txt" in the root (node 1)
    mov $50, %eax
    mov $1, %ecx
    mov $1, %edx
    call fuse_hdr
    lea name, %esi
    mov $0x210028, %edi
    mov $10, %ecx
    rep movsb
    call fuse_call
    lea msg_lookup, %ebx
    call print_error
    mov 0x220010, %eax
    mov %eax, node

    # FUSE_OPEN read-only
    mov $48, %eax
    mov $14, %ecx
    mov node, %edx
    call fuse_hdr
    movl $0, 0x210028
    movl $0, 0x21002c
    call fuse_call
    lea msg_open, %ebx
    call print_error
    mov 0x220010, %eax
    mov %eax, fh
    mov 0x220014, %eax
    mov %eax, fh + 4

    # FUSE_READ 256 bytes at offset 0
    mov $80, %eax
    mov $15, %ecx
    mov node, %edx
    call fuse_hdr
    mov $0x210028, %edi
    xor %eax, %eax
    mov $10, %ecx
    rep stosl
    mov fh, %eax
    mov %eax, 0x210028
    mov fh + 4, %eax
    mov %eax, 0x21002c
    movl $256, 0x210038
    call fuse_call
    lea msg_read, %ebx
    call print_error
    lea msg_data, %ebx
    call puts
    mov 0x220000, %ecx
    sub $16, %ecx
    mov $0x220010, %ebx
    mov $0x3f8, %dx
1:  test %ecx, %ecx
    jz 2f
    movb (%ebx), %al
    out %al, %dx
    inc %ebx
    dec %ecx
    jmp 1b
2:  jmp reset

# Writes a FUSE in-header at 0x210000: length %eax, opcode %ecx, node %edx.
fuse_hdr:
    mov %eax, 0x210000
    mov %ecx, 0x210004
    incl unique
    mov unique, %eax
    mov %eax, 0x210008
    movl $0, 0x21000c
    mov %edx, 0x210010
    movl $0, 0x210014
    movl $0, 0x210018
    movl $0, 0x21001c
    movl $0, 0x210020
    movl $0, 0x210024
    ret

# Queues the request at 0x210000 (its length in its header) with a 4 KiB reply buffer at
# 0x220000 as descriptors 0 -> 1, kicks queue 1 and waits until it is used.
fuse_call:
    movl $0x210000, 0x204000
    movl $0, 0x204004
    mov 0x210000, %eax
    mov %eax, 0x204008
    movw $1, 0x20400c
    movw $1, 0x20400e
    movl $0x220000, 0x204010
    movl $0, 0x204014
    movl $4096, 0x204018
    movw $2, 0x20401c
    movw $0, 0x20401e
    movzwl avail_idx, %eax
    mov %eax, %ecx
    and $7, %ecx
    movw $0, 0x205004(,%ecx,2)
    inc %eax
    mov %ax, avail_idx
    mov %ax, 0x205002
    movl $1, 0xd0000050
3:  cmpw %ax, 0x206002
    jne 3b
    ret

# Prints the label at %ebx and the error of the reply at 0x220000.
print_error:
    call puts
    mov 0x220004, %eax
    call hex32
    ret
{SERIAL_HELPERS}
    .align 4
unique: .long 0
node: .long 0
fh: .long 0, 0
avail_idx: .word 0
name: .asciz "hello.txt"
msg_status: .asciz "status="
msg_init: .asciz " init="
msg_major: .asciz " major="
msg_lookup: .asciz " lookup="
msg_open: .asciz " open="
msg_read: .asciz " read="
msg_data: .asciz "\ndata: "
{PVH_NOTE}
"#,
        bring_up = virtio_bring_up(0xd000_0000, 1 << 32, 2),
    )
}

/// virtiofsd sharing a temp dir, killed by pid when dropped.
pub struct Virtiofsd {
    child: Child,
    /// Its vhost-user socket.
    pub socket: PathBuf,
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

pub fn start_virtiofsd(dir: &Path, shared: &Path) -> Virtiofsd {
    let binary = std::env::var_os("KATA_VIRTIOFSD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/virtiofsd"));
    assert!(
        binary.exists(),
        "{} is missing: run `make setup` (or set KATA_VIRTIOFSD)",
        binary.display()
    );
    let socket = dir.join("virtiofsd.sock");
    let child = Command::new(binary)
        .arg("--socket-path")
        .arg(&socket)
        .arg("--shared-dir")
        .arg(shared)
        .args(["--sandbox", "none", "--log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !socket.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "virtiofsd made no socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Virtiofsd { child, socket }
}

/// What [`block_guest`] writes at the start of sector 1 (the rest of the sector is zeros).
pub const BLOCK_GUEST_TEXT: &str = "written by the guest";

/// PVH guest that drives virtio-blk as the first virtio-mmio device: prints the device id,
/// status, capacity (low word) and blk_size (a 2-byte config read), reads sector 0 and prints
/// it as a string, writes [`BLOCK_GUEST_TEXT`] to sector 1, flushes, prints each request's
/// status and used length, then resets. Each request waits for the used ring without a
/// timeout: the test's deadline catches a device that never answers.
pub fn block_guest() -> String {
    format!(
        r#"
{PVH_START}    lea msg_id, %ebx
    call puts
    mov 0xd0000008, %eax
    call hex32

    # VERSION_1 only
{bring_up}    lea msg_status, %ebx
    call puts
    mov 0xd0000070, %eax
    call hex32
    lea msg_capacity, %ebx
    call puts
    mov 0xd0000100, %eax
    call hex32
    lea msg_blk_size, %ebx
    call puts
    movzwl 0xd0000114, %eax
    call hex32
    mov $'\n', %al
    out %al, %dx

    # status bytes at 0x205000.. start as 0xff: the device must overwrite them
    movl $0xffffffff, 0x205000

    # request 1, descriptors 0-2: IN sector 0 into 512 bytes at 0x204000
    movl $0, 0x203000
    movl $0, 0x203004
    movl $0, 0x203008
    movl $0, 0x20300c
    movl $0x203000, 0x200000
    movl $0, 0x200004
    movl $16, 0x200008
    movw $1, 0x20000c
    movw $1, 0x20000e
    movl $0x204000, 0x200010
    movl $0, 0x200014
    movl $512, 0x200018
    movw $3, 0x20001c
    movw $2, 0x20001e
    movl $0x205000, 0x200020
    movl $0, 0x200024
    movl $1, 0x200028
    movw $2, 0x20002c
    movw $0, 0x20002e
    movw $0, 0x201004
    movw $1, 0x201002
    movl $0, 0xd0000050
    mov $1, %eax
    call wait_used

    # request 2, descriptors 3-5: OUT sector 1 from 512 bytes at 0x206000
    lea msg_disk, %esi
    mov $0x206000, %edi
    mov $(msg_disk_end - msg_disk), %ecx
    rep movsb
    movl $1, 0x203010
    movl $0, 0x203014
    movl $1, 0x203018
    movl $0, 0x20301c
    movl $0x203010, 0x200030
    movl $0, 0x200034
    movl $16, 0x200038
    movw $1, 0x20003c
    movw $4, 0x20003e
    movl $0x206000, 0x200040
    movl $0, 0x200044
    movl $512, 0x200048
    movw $1, 0x20004c
    movw $5, 0x20004e
    movl $0x205001, 0x200050
    movl $0, 0x200054
    movl $1, 0x200058
    movw $2, 0x20005c
    movw $0, 0x20005e
    movw $3, 0x201006
    movw $2, 0x201002
    movl $0, 0xd0000050
    mov $2, %eax
    call wait_used

    # request 3, descriptors 6-7: FLUSH
    movl $4, 0x203020
    movl $0, 0x203024
    movl $0, 0x203028
    movl $0, 0x20302c
    movl $0x203020, 0x200060
    movl $0, 0x200064
    movl $16, 0x200068
    movw $1, 0x20006c
    movw $7, 0x20006e
    movl $0x205002, 0x200070
    movl $0, 0x200074
    movl $1, 0x200078
    movw $2, 0x20007c
    movw $0, 0x20007e
    movw $6, 0x201008
    movw $3, 0x201002
    movl $0, 0xd0000050
    mov $3, %eax
    call wait_used

    lea msg_sector0, %ebx
    call puts
    mov $0x204000, %ebx
    call puts
    lea msg_in, %ebx
    call puts
    movzbl 0x205000, %eax
    call hex32
    lea msg_len, %ebx
    call puts
    mov 0x202008, %eax
    call hex32
    lea msg_out, %ebx
    call puts
    movzbl 0x205001, %eax
    call hex32
    lea msg_len, %ebx
    call puts
    mov 0x202010, %eax
    call hex32
    lea msg_flush, %ebx
    call puts
    movzbl 0x205002, %eax
    call hex32
    lea msg_len, %ebx
    call puts
    mov 0x202018, %eax
    call hex32
    mov $'\n', %al
    out %al, %dx
    jmp reset

# Waits until the used ring's idx is %ax.
wait_used:
1:  cmpw %ax, 0x202002
    jne 1b
    ret
{SERIAL_HELPERS}
msg_id: .asciz "blk id="
msg_status: .asciz " status="
msg_capacity: .asciz " capacity="
msg_blk_size: .asciz " blk_size="
msg_sector0: .asciz "sector 0: "
msg_in: .asciz "in="
msg_out: .asciz " out="
msg_flush: .asciz " flush="
msg_len: .asciz " len="
msg_disk: .ascii "{BLOCK_GUEST_TEXT}"
msg_disk_end:
{PVH_NOTE}
"#,
        bring_up = virtio_bring_up(0xd000_0000, 1 << 32, 1),
    )
}

/// Where the SMP guest copies its 16-bit AP trampoline: a page below 1 MiB that the VMM
/// leaves free (layout.rs: the boot page tables end at 0xc000, the command line starts at
/// 0x20000). Its page number is the STARTUP IPI vector.
pub const AP_TRAMPOLINE: u32 = 0x10000;

/// PVH guest for `"vcpus": 2`: the boot vCPU scans the first KiB of the EBDA for the MP
/// floating pointer, follows it to the configuration table, checks its checksum, counts the
/// processor entries and finds the IOAPIC, and prints "MP cpus=N ioapic=ADDR". It then copies
/// a real-mode trampoline to [`AP_TRAMPOLINE`] and starts vCPU 1 (APIC id 1) with INIT,
/// STARTUP, STARTUP through the local APIC's ICR. The AP prints "AP" and its APIC id from
/// CPUID, sets a flag in the trampoline page and halts with interrupts off; the boot vCPU
/// waits for the flag (bounded by the TSC), prints "ap up" (or "ap timeout") and resets.
pub fn smp_guest() -> String {
    format!(
        r#"
{PVH_START}    # The floating pointer: "_MP_" on a 16-byte boundary in 0x9fc00..0xa0000.
    mov $0x9fc00, %esi
1:  cmpl $0x5f504d5f, (%esi)
    je found_mpf
    add $16, %esi
    cmp $0xa0000, %esi
    jb 1b
    lea msg_no_mpf, %ebx
    call puts
    jmp reset
found_mpf:
    mov 4(%esi), %esi
    cmpl $0x504d4350, (%esi)
    jne no_pcmp
    # The base table's bytes sum to 0.
    movzwl 4(%esi), %ecx
    mov %esi, %edi
    xor %eax, %eax
2:  addb (%edi), %al
    inc %edi
    dec %ecx
    jnz 2b
    test %al, %al
    jnz bad_sum
    # Walk the entries: processors are 20 bytes, all others 8.
    movzwl 34(%esi), %ecx
    lea 44(%esi), %edi
    xor %ebp, %ebp
3:  movzbl (%edi), %eax
    test %eax, %eax
    jnz 4f
    inc %ebp
    add $20, %edi
    jmp 6f
4:  cmp $2, %eax
    jne 5f
    mov 4(%edi), %eax
    mov %eax, ioapic_addr
5:  add $8, %edi
6:  dec %ecx
    jnz 3b
    lea msg_cpus, %ebx
    call puts
    mov %ebp, %eax
    call hex32
    lea msg_ioapic, %ebx
    call puts
    mov ioapic_addr, %eax
    call hex32
    mov $'\n', %al
    out %al, %dx

    # Start vCPU 1 at the trampoline.
    lea tramp_start, %esi
    mov ${AP_TRAMPOLINE}, %edi
    mov $(tramp_end - tramp_start), %ecx
    rep movsb
    movl $0, {AP_TRAMPOLINE} + 0x800
    movl $0x01000000, 0xfee00310
    movl $0x00004500, 0xfee00300
    call icr_idle
    mov $2, %ebp
7:  movl $0x01000000, 0xfee00310
    movl $(0x00004600 | ({AP_TRAMPOLINE} >> 12)), 0xfee00300
    call icr_idle
    dec %ebp
    jnz 7b

    # Wait for the AP's flag, for at most 2^35 TSC ticks (seconds).
    rdtsc
    mov %edx, %ebp
    add $8, %ebp
8:  cmpl $1, {AP_TRAMPOLINE} + 0x800
    je ap_up
    pause
    rdtsc
    cmp %ebp, %edx
    jb 8b
    lea msg_timeout, %ebx
    call puts
    jmp reset
ap_up:
    lea msg_ap_up, %ebx
    call puts
    jmp reset

# Waits until the ICR's delivery status bit clears.
icr_idle:
    testl $0x1000, 0xfee00300
    jnz icr_idle
    ret

no_pcmp:
    lea msg_no_pcmp, %ebx
    call puts
    jmp reset
bad_sum:
    lea msg_bad_sum, %ebx
    call puts
    jmp reset

# The AP starts here in real mode, CS = {AP_TRAMPOLINE} >> 4, IP = 0.
    .code16
tramp_start:
    cli
    mov %cs, %ax
    mov %ax, %ds
    # CPUID.1:EBX[31:24], the initial APIC id (one digit is enough here).
    mov $1, %eax
    cpuid
    shr $24, %ebx
    mov $0x3f8, %dx
    mov $'A', %al
    out %al, %dx
    mov $'P', %al
    out %al, %dx
    mov $' ', %al
    out %al, %dx
    mov %bl, %al
    add $'0', %al
    out %al, %dx
    mov $'\n', %al
    out %al, %dx
    movl $1, 0x800
9:  hlt
    jmp 9b
tramp_end:
    .code32

{SERIAL_HELPERS}
    .align 4
ioapic_addr: .long 0
msg_cpus: .asciz "MP cpus="
msg_ioapic: .asciz " ioapic="
msg_ap_up: .asciz "ap up\n"
msg_timeout: .asciz "ap timeout\n"
msg_no_mpf: .asciz "no _MP_\n"
msg_no_pcmp: .asciz "no PCMP\n"
msg_bad_sum: .asciz "bad PCMP checksum\n"
{PVH_NOTE}
"#
    )
}

/// PVH guest that drives virtio-net (second device) by hand: accepts MAC, sets up rx (4
/// buffers of 2 KiB) and tx queues, prints "net ready mac=<mac from config space>", waits for
/// the first received frame of EtherType 0x88b5 and prints its used length and payload as
/// "got <len> <payload>", then transmits "hello from guest" to the broadcast address from its
/// MAC with the same EtherType, prints "sent" once the frame is used, and resets.
pub fn net_frame_guest() -> String {
    format!(
        r#"
{PVH_START}    # VERSION_1 and MAC; queue 0: rx, queue 1: tx
{bring_up}    # rx descriptors i = 0..3: 2 KiB device-writable buffers at 0x210000 + i * 2 KiB
{rx_buffers}    lea msg_ready, %ebx
    call puts
    xor %ebp, %ebp
2:  movzbl 0xd0001100(%ebp), %eax
    call hex8
    inc %ebp
    cmp $6, %ebp
    jne 2b
    mov $'\n', %al
    out %al, %dx

    # the first frame of our EtherType (big endian 0x88b5 after two MACs and the header)
3:  call next_rx
    cmpw $0xb588, 24(%edi)
    jne 3b
    lea msg_got, %ebx
    call puts
    mov %ebp, %eax
    call hex32
    mov $' ', %al
    out %al, %dx
    lea 26(%edi), %ebx
    lea (%edi,%ebp), %ecx
4:  cmp %ecx, %ebx
    jae 5f
    movb (%ebx), %al
    out %al, %dx
    inc %ebx
    jmp 4b
5:  mov $'\n', %al
    out %al, %dx

    # transmit at 0x220000: zero header, broadcast, our MAC, EtherType, greeting
    movl $0, 0x220000
    movl $0, 0x220004
    movl $0, 0x220008
    movl $0xffffffff, 0x22000c
    movw $0xffff, 0x220010
    xor %ebp, %ebp
6:  movb 0xd0001100(%ebp), %al
    movb %al, 0x220012(%ebp)
    inc %ebp
    cmp $6, %ebp
    jne 6b
    movw $0xb588, 0x220018
    lea msg_hello, %esi
    mov $0x22001a, %edi
    mov $(msg_hello_end - msg_hello), %ecx
    rep movsb
    movl $0x220000, 0x204000
    movl $0, 0x204004
    movl $(26 + msg_hello_end - msg_hello), 0x204008
    movw $0, 0x20400c
    movw $0, 0x20400e
    movw $0, 0x205004
    movw $1, 0x205002
    movl $1, 0xd0001050
    mov $2000000, %ecx
7:  cmpw $1, 0x206002
    je 8f
    dec %ecx
    jnz 7b
    lea msg_tx_timeout, %ebx
    call puts
    jmp reset
8:  lea msg_sent, %ebx
    call puts
    jmp reset

# Waits for the next used rx entry: its buffer in %edi, its length in %ebp.
next_rx:
    movzwl rx_last, %eax
9:  cmpw %ax, 0x202002
    je 9b
    mov %eax, %ecx
    and $7, %ecx
    mov 0x202004(,%ecx,8), %edx
    mov 0x202008(,%ecx,8), %ebp
    shl $11, %edx
    lea 0x210000(%edx), %edi
    inc %eax
    mov %ax, rx_last
    ret

{SERIAL_HELPERS}
rx_last: .word 0
msg_ready: .asciz "net ready mac="
msg_got: .asciz "got "
msg_sent: .asciz "sent\n"
msg_tx_timeout: .asciz "tx timeout\n"
msg_hello: .ascii "hello from guest"
msg_hello_end:
{PVH_NOTE}
"#,
        bring_up = virtio_bring_up(0xd000_1000, (1 << 32) | (1 << 5), 2),
        rx_buffers = post_rx_buffers(0xd000_1000, 4, 11),
    )
}
