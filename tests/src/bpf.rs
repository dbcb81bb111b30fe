//! The few `bpf(2)` commands the tests issue themselves, independent of the
//! daemon and of aya: run-time statistics, a program fd by id, and
//! `BPF_PROG_TEST_RUN`.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const BPF_PROG_TEST_RUN: i64 = 10;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_ENABLE_STATS: i64 = 32;

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
