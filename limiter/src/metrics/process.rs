//! The standard `process_*` families every Prometheus client library
//! exports, read from `/proc/self` at scrape time.

use super::Page;

/// What `/proc` says about this process; a field it could not read is
/// left out of the page.
#[derive(Debug, Default, PartialEq)]
pub struct Process {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl Process {
    /// Reads this process's figures.
    pub fn read() -> Self {
        let ticks =
            nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok()));
        let page =
            nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as u64;
        let mut p = parse_stat(&stat, ticks, page, boot);
        p.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
        p.max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|l| max_open_files(&l));
        p
    }
}

/// The fields of `/proc/self/stat` after the command name (which may hold
/// spaces and parentheses, so it is skipped up to its last `)`).
fn parse_stat(stat: &str, ticks: f64, page: u64, boot: Option<f64>) -> Process {
    let Some((_, rest)) = stat.rsplit_once(')') else { return Process::default() };
    // `rest` starts at field 3 (state); utime is field 14, stime 15,
    // starttime 22, vsize 23, rss 24 (in pages).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Process {
        cpu_seconds: field(14).zip(field(15)).map(|(u, s)| (u + s) as f64 / ticks),
        resident_bytes: field(24).map(|pages| pages * page),
        virtual_bytes: field(23),
        start_time_seconds: boot.zip(field(22)).map(|(b, start)| b + start as f64 / ticks),
        ..Process::default()
    }
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    limits.lines().find_map(|l| l.strip_prefix("Max open files")?.split_whitespace().next()?.parse().ok())
}

/// Writes the families of what could be read.
pub fn write(page: &mut Page, p: &Process) {
    one(
        page,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        p.cpu_seconds,
    );
    one(page, "process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.", p.resident_bytes);
    one(page, "process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.", p.virtual_bytes);
    one(page, "process_open_fds", "gauge", "Open file descriptors.", p.open_fds);
    one(page, "process_max_fds", "gauge", "The most open file descriptors allowed.", p.max_fds);
    let start = "When the process started, in seconds since the Unix epoch.";
    one(page, "process_start_time_seconds", "gauge", start, p.start_time_seconds);
}

/// The benchmark build's allocation count (`count-allocations`).
#[cfg(feature = "count-allocations")]
pub fn write_allocations(page: &mut Page) {
    one(
        page,
        "limiter_process_allocations_total",
        "counter",
        "Allocations and reallocations made by the process (a count-allocations build only).",
        Some(crate::alloc_count::allocations()),
    );
}

/// A family of one sample, left out when the value could not be read.
fn one(page: &mut Page, name: &str, kind: &str, help: &str, value: Option<impl std::fmt::Display>) {
    if let Some(v) = value {
        page.family(name, kind, help).sample(name, &[], v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (li (mi) ter) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 123456789 512 18446744073709551615";
        let p = parse_stat(stat, 100.0, 4096, Some(1_700_000_000.0));
        assert_eq!(p.cpu_seconds, Some(3.0));
        assert_eq!(p.resident_bytes, Some(512 * 4096));
        assert_eq!(p.virtual_bytes, Some(123_456_789));
        assert_eq!(p.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(parse_stat("garbage", 100.0, 4096, None), Process::default());
    }

    #[test]
    fn the_soft_open_files_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }

    #[test]
    fn this_process_reads_itself() {
        let p = Process::read();
        assert!(
            p.cpu_seconds.is_some() && p.resident_bytes.unwrap_or(0) > 0 && p.open_fds.unwrap_or(0) > 0,
            "{p:?}"
        );
        assert!(p.start_time_seconds.unwrap_or(0.0) > 1.5e9 && p.max_fds.unwrap_or(0) > 0, "{p:?}");
    }
}
