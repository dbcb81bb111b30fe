//! The few `bpf(2)` commands the tests issue themselves, independent of the
//! daemon and of aya: run-time statistics, a program fd by id,
//! `BPF_PROG_TEST_RUN`, and a sock_ops program that returns at once (the
//! floor a benchmark measures the gate's program against).

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_TEST_RUN: i64 = 10;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_LINK_CREATE: i64 = 28;
const BPF_ENABLE_STATS: i64 = 32;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;

fn bpf(cmd: i64, attr: &mut [u64; 16]) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-initialised, 128-byte `union bpf_attr` whose
    // pointers (if any) point at live buffers of the stated sizes.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of::<[u64; 16]>()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Turns on run-time statistics (`run_cnt`, `run_time_ns`) while the fd
/// lives.
pub fn enable_stats() -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    attr[0] = 0; // BPF_STATS_RUN_TIME
    let fd = bpf(BPF_ENABLE_STATS, &mut attr)?;
    // SAFETY: a new fd the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// An fd of the loaded program `id`.
pub fn prog_fd(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: a new fd the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A sock_ops program of two instructions (`r0 = 1; exit`) attached to
/// the cgroup `cgroup` by a bpf link, beside whatever else is attached
/// there (cgroup links always share the hook); detached when dropped. Its
/// run-time statistics are what any sock_ops program costs per run under
/// the same load before it does anything: the call, and with statistics
/// on, the two clock reads around it.
pub struct FloorSockOps {
    prog: OwnedFd,
    _link: OwnedFd,
}

impl FloorSockOps {
    pub fn attach(cgroup: &std::fs::File) -> io::Result<Self> {
        const BPF_PROG_TYPE_SOCK_OPS: u64 = 13;
        const BPF_CGROUP_SOCK_OPS: u64 = 3;
        // BPF_ALU64 | BPF_MOV | BPF_K, r0, imm 1; BPF_JMP | BPF_EXIT.
        let insns: [u64; 2] = [0xb7 | (1 << 32), 0x95];
        let license = b"GPL\0";
        let mut attr = [0u64; 16];
        attr[0] = BPF_PROG_TYPE_SOCK_OPS | ((insns.len() as u64) << 32); // prog_type, insn_cnt
        attr[1] = insns.as_ptr() as u64;
        attr[2] = license.as_ptr() as u64;
        let fd = bpf(BPF_PROG_LOAD, &mut attr)?;
        // SAFETY: a new fd the kernel just returned.
        let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut attr = [0u64; 16];
        // prog_fd, target_fd; attach_type, flags.
        attr[0] = prog.as_raw_fd() as u64 | ((cgroup.as_raw_fd() as u64) << 32);
        attr[1] = BPF_CGROUP_SOCK_OPS;
        let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
        // SAFETY: a new fd the kernel just returned.
        let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Self { prog, _link: link })
    }

    /// (run_time_ns, run_cnt) so far.
    pub fn stats(&self) -> io::Result<(u64, u64)> {
        // struct bpf_prog_info (232 bytes): run_time_ns at byte 192, run_cnt
        // at 200.
        let mut info = [0u64; 29];
        let mut attr = [0u64; 16];
        attr[0] = self.prog.as_raw_fd() as u64 | ((size_of_val(&info) as u64) << 32); // bpf_fd, info_len
        attr[1] = info.as_mut_ptr() as u64;
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        Ok((info[24], info[25]))
    }
}

/// What one `BPF_PROG_TEST_RUN` returned.
#[derive(Debug)]
pub struct TestRun {
    pub retval: u32,
    pub data: Vec<u8>,
    /// Average nanoseconds per run, as the kernel measured it.
    pub duration_ns: u32,
}

/// Runs the program on `data` `repeat` times.
pub fn test_run(prog: &OwnedFd, data: &[u8], repeat: u32) -> io::Result<TestRun> {
    test_run_on(prog, data, repeat, None)
}

/// As [`test_run`], with the frame arriving on interface `ifindex` (of the
/// calling thread's network namespace) when given: an XDP context whose
/// `ingress_ifindex` is set.
pub fn test_run_on(prog: &OwnedFd, data: &[u8], repeat: u32, ifindex: Option<u32>) -> io::Result<TestRun> {
    let mut out = vec![0u8; data.len() + 256];
    let (retval, size_out, duration_ns) = run(prog, data, Some(&mut out), repeat, ifindex, 0)?;
    out.truncate(size_out);
    Ok(TestRun { retval, data: out, duration_ns })
}

/// `BPF_F_TEST_XDP_LIVE_FRAMES`: each repeat runs on a fresh copy of the
/// frame, and what the program returns is carried out (`XDP_TX` really
/// transmits on the interface, `XDP_PASS` hands the frame to the stack).
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// Runs an XDP program `repeat` times on fresh copies of `data` arriving
/// on `ifindex`, each verdict carried out; the kernel's average
/// nanoseconds per frame.
pub fn test_run_live(prog: &OwnedFd, data: &[u8], repeat: u32, ifindex: u32) -> io::Result<u32> {
    // Live frames return no data.
    let (_, _, duration_ns) = run(prog, data, None, repeat, Some(ifindex), BPF_F_TEST_XDP_LIVE_FRAMES)?;
    Ok(duration_ns)
}

/// One `BPF_PROG_TEST_RUN`: (retval, bytes written to `out`, average ns).
fn run(
    prog: &OwnedFd,
    data: &[u8],
    out: Option<&mut Vec<u8>>,
    repeat: u32,
    ifindex: Option<u32>,
    flags: u32,
) -> io::Result<(u32, usize, u32)> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
    // rx_queue_index, egress_ifindex.
    // data_end must equal the frame's length.
    let ctx: [u32; 6] = [0, data.len() as u32, 0, ifindex.unwrap_or(0), 0, 0];
    let mut attr = [0u64; 16];
    attr[0] = prog.as_raw_fd() as u64; // prog_fd, retval = 0
    attr[1] = data.len() as u64; // data_size_in
    attr[2] = data.as_ptr() as u64;
    if let Some(out) = out {
        attr[1] |= (out.len() as u64) << 32; // data_size_out
        attr[3] = out.as_mut_ptr() as u64;
    }
    attr[4] = u64::from(repeat);
    if ifindex.is_some() {
        attr[5] = size_of::<[u32; 6]>() as u64; // ctx_size_in (ctx_size_out 0)
        attr[6] = ctx.as_ptr() as u64; // ctx_in
    }
    attr[8] = u64::from(flags); // flags, cpu 0
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(((attr[0] >> 32) as u32, (attr[1] >> 32) as usize, (attr[4] >> 32) as u32))
}
