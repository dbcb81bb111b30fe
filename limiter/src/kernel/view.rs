//! The read-only view of a gate that `limiter dump`, `limiter top` and
//! `/metrics` show: one row per port, the links, the busiest client groups.

use std::{collections::BTreeMap, path::PathBuf};

use limiter_common::{
    GateConfig, LIMIT_FLAG_DRY_RUN, PortLimit, PortStats, Refusals, SHED_FLAG_DRY_RUN, ShedCounts, ShedPort,
    SourceKey, path, reason,
};
use serde::{Deserialize, Serialize};

use super::{
    Gate, KernelError,
    pins::{self, LINK_COUNT, LINK_REFUSE},
};

/// How many groups a snapshot lists.
pub const TOP_SOURCES: usize = 20;

/// Refusals of one port, by reason and by path. In JSON (`/status`,
/// `dump --json`) one object keyed by the names of
/// `limiter_common::reason::ALL` then `path::ALL`:
/// `{"port_full": 7, …, "shed": 0, "sk_lookup": 11, "xdp": 3}`, as when
/// the row had a field per name; serialised by hand so that the tables
/// stay the one place those names are written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefusalRow {
    /// By reason, indexed by `limiter_common::reason` (`shed` included).
    pub by_reason: [u64; reason::REPORTED],
    /// By path, indexed by `limiter_common::path`.
    pub by_path: [u64; path::COUNT],
}

impl Serialize for RefusalRow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(reason::REPORTED + path::COUNT))?;
        for (r, n) in reason::ALL.iter().zip(&self.by_reason) {
            map.serialize_entry(r.name, n)?;
        }
        for (p, n) in path::ALL.iter().zip(&self.by_path) {
            map.serialize_entry(p.name, n)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for RefusalRow {
    /// A name the row lacks counts 0 (an older daemon's rows had no
    /// `shed`); one the tables lack is skipped.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Row;
        impl<'de> serde::de::Visitor<'de> for Row {
            type Value = RefusalRow;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("refusal counts by reason and by path")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RefusalRow, A::Error> {
                let mut row = RefusalRow::default();
                while let Some(key) = map.next_key::<String>()? {
                    let slot = match reason::ALL.iter().position(|r| r.name == key) {
                        Some(q) => &mut row.by_reason[q],
                        None => match path::ALL.iter().position(|p| p.name == key) {
                            Some(p) => &mut row.by_path[p],
                            None => {
                                map.next_value::<serde::de::IgnoredAny>()?;
                                continue;
                            }
                        },
                    };
                    *slot = map.next_value()?;
                }
                Ok(row)
            }
        }
        d.deserialize_map(Row)
    }
}

/// The state of one local port, as `dump` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRow {
    pub port: u16,
    /// `None`: no cap on the port as a whole.
    pub limit: Option<u32>,
    /// `None`: no per-source cap.
    pub per_source_max: Option<u32>,
    pub dry_run: bool,
    pub established: u64,
    pub high_watermark: u64,
    pub admitted: u64,
    /// All refusals (both paths, every reason).
    pub refused: u64,
    pub refused_by: RefusalRow,
    /// Refusals by `[path][reason]` (`limiter_common::path`, `reason`;
    /// every reported reason, `shed` included).
    pub refused_matrix: [[u64; reason::REPORTED]; path::COUNT],
    /// Would-be refusals of a dry-run port, every reason.
    pub would_refuse: u64,
    pub would_refuse_by: RefusalRow,
    /// Attempts from trusted prefixes admitted past a cap or while the
    /// port was shedding.
    pub trusted_admitted: u64,
    /// Client groups with connections on this port now.
    pub sources: u64,
    /// The coupled shedding's flag on this port, when raised.
    #[serde(default)]
    pub shedding: Option<ShedRow>,
    /// Attempts admitted as probes while the port was shedding.
    #[serde(default)]
    pub shed_probes: u64,
}

/// A raised shedding flag, as the programs read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShedRow {
    /// Milliseconds until the flag lapses unless renewed; 0: lapsed (the
    /// daemon that raised it stopped renewing it), so nothing is shed.
    pub expires_in_ms: u64,
    pub dry_run: bool,
    /// One attempt in this many is admitted as a probe.
    pub probe_one_in: u32,
}

/// One pinned link and the program behind it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkRow {
    pub pin: String,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
    /// Why the pin could not be looked at (it exists, but opening it
    /// failed): the link's state is unknown, not detached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Whether the counting and refusing links are attached, as far as the
/// daemon can look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attachment {
    Attached,
    /// A fixed link's pin is gone: `limiter unload` ran under the daemon.
    Detached,
    /// A pin is there but could not be opened: nothing is known.
    Unknown(String),
}

impl Attachment {
    /// What the rows say of the fixed links.
    pub fn of(links: &[LinkRow]) -> Self {
        let fixed = links.iter().filter(|l| [LINK_COUNT, LINK_REFUSE].contains(&l.pin.as_str()));
        let mut out = Self::Attached;
        for link in fixed {
            match (&link.unreadable, link.link_id) {
                (Some(why), _) => out = Self::Unknown(format!("{}: {why}", link.pin)),
                (None, None) => return Self::Detached,
                (None, Some(_)) => {}
            }
        }
        out
    }
}

/// A client group with connections now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRow {
    pub port: u16,
    /// The group as a prefix, such as `192.0.2.0/24`.
    pub group: String,
    pub established: u64,
}

/// Everything the maps and link pins say.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub pin_path: PathBuf,
    pub layout_version: u32,
    pub netns_cookie: u64,
    pub untracked_sockets: u64,
    pub untracked_sources: u64,
    /// Connections older than the gate, counted at start-up.
    pub walked: u64,
    /// Entries of the connection table: the most connections the gate
    /// counts at once.
    #[serde(default)]
    pub connection_slots: u64,
    pub source_prefix_v4: u32,
    pub source_prefix_v6: u32,
    pub source_slots: u64,
    /// Slots counting a group with connections now.
    pub source_slots_used: u64,
    /// Batched map reads this snapshot made of the source table and its
    /// change index (the whole table on a process's first read, then only
    /// what changed).
    #[serde(default)]
    pub source_read_calls: u64,
    pub trusted: Vec<String>,
    pub trusted_reserve: u32,
    pub links: Vec<LinkRow>,
    pub ports: Vec<PortRow>,
    /// The groups with the most connections (at most [`TOP_SOURCES`]).
    pub top_sources: Vec<SourceRow>,
}

impl Gate {
    /// Reads every counter and link.
    pub fn snapshot(&self) -> Result<Snapshot, KernelError> {
        let config = self.config()?;
        let limits = self.limits()?;
        let refusals = self.refusals()?;
        let shed = self.shed_counts()?;
        let counters = self.counters()?;
        let ((groups, slots_used), cost) = self.source_groups()?;
        let mut sources_per_port: BTreeMap<u16, u64> = BTreeMap::new();
        for (key, _) in &groups {
            *sources_per_port.entry(key.port).or_default() += 1;
        }
        let mut ports = self.active_ports()?;
        ports.extend(limits.keys().chain(refusals.keys()).chain(shed.keys()));
        ports.sort_unstable();
        ports.dedup();
        let mut rows = Vec::with_capacity(ports.len());
        for port in ports {
            let mut row = row(port, limits.get(&port), &self.port_stats(port)?, refusals.get(&port));
            row.sources = sources_per_port.get(&port).copied().unwrap_or(0);
            add_shedding(&mut row, &self.shed_flag(port)?, shed.get(&port), super::shed::boot_ns());
            rows.push(row);
        }
        Ok(Snapshot {
            pin_path: self.pin_dir().to_path_buf(),
            layout_version: config.layout_version,
            netns_cookie: config.netns_cookie,
            untracked_sockets: counters.untracked_sockets,
            untracked_sources: counters.untracked_sources,
            walked: counters.walked,
            connection_slots: u64::from(self.connection_slots()),
            source_prefix_v4: config.prefix_v4,
            source_prefix_v6: config.prefix_v6,
            source_slots: u64::from(self.source_slots()),
            source_slots_used: slots_used,
            source_read_calls: cost.calls,
            trusted: self.trusted_prefixes()?.iter().map(ToString::to_string).collect(),
            trusted_reserve: config.trusted_reserve,
            links: self.links(),
            ports: rows,
            top_sources: top_sources(groups, &config),
        })
    }

    /// Whether the counting and refusing links are still pinned and
    /// attached (a few syscalls: the link pins only).
    pub fn attachment(&self) -> Attachment {
        Attachment::of(&self.links())
    }

    /// The fixed links, then the XDP links, looked at through the pin
    /// directory the gate holds open (so the answer is the same before
    /// and after the daemon drops its privileges).
    fn links(&self) -> Vec<LinkRow> {
        let mut names: Vec<String> = [LINK_COUNT, LINK_REFUSE].iter().map(|s| (*s).to_owned()).collect();
        names.extend(pins::xdp_interfaces(self.reach()).iter().map(|i| pins::xdp_link(i)));
        names
            .into_iter()
            .map(|pin| match pins::link_info(&self.reach().join(&pin)) {
                Ok(info) => LinkRow {
                    pin,
                    link_id: info.as_ref().map(|i| i.id()),
                    program_id: info.as_ref().map(|i| i.program_id()),
                    unreadable: None,
                },
                Err(why) => LinkRow { pin, link_id: None, program_id: None, unreadable: Some(why) },
            })
            .collect()
    }
}

/// The busiest groups, most connections first (ties by port, then group).
fn top_sources(groups: Vec<(SourceKey, u64)>, config: &GateConfig) -> Vec<SourceRow> {
    let mut top: Vec<SourceRow> = groups
        .into_iter()
        .map(|(key, n)| SourceRow { port: key.port, group: group_name(&key, config), established: n })
        .collect();
    top.sort_by(|a, b| {
        b.established.cmp(&a.established).then(a.port.cmp(&b.port)).then(a.group.cmp(&b.group))
    });
    top.truncate(TOP_SOURCES);
    top
}

/// A group as a prefix: `192.0.2.0/24`, `2001:db8::/64`.
fn group_name(key: &SourceKey, config: &GateConfig) -> String {
    if key.family == 4 {
        format!("{}/{}", std::net::Ipv4Addr::from(key.addr[0]), config.prefix_v4)
    } else {
        let bits = key.addr.iter().fold(0u128, |acc, w| (acc << 32) | u128::from(*w));
        format!("{}/{}", std::net::Ipv6Addr::from(bits), config.prefix_v6)
    }
}

/// One port's row from its limit, counters and refusals (`sources` is
/// filled in by the caller).
fn row(port: u16, limit: Option<&PortLimit>, s: &PortStats, r: Option<&Refusals>) -> PortRow {
    let r = r.copied().unwrap_or_default();
    PortRow {
        port,
        limit: limit.map(|l| l.max_established).filter(|&m| m != 0),
        per_source_max: limit.map(|l| l.per_source_max).filter(|&m| m != 0),
        dry_run: limit.is_some_and(|l| l.flags & LIMIT_FLAG_DRY_RUN != 0),
        established: s.established,
        high_watermark: s.high_watermark,
        admitted: s.admitted,
        refused: r.refused.iter().sum(),
        // The limits' reasons; `shed` is the shedding's (`add_shedding`).
        refused_by: RefusalRow {
            by_reason: std::array::from_fn(|q| if q < reason::COUNT { r.by_reason(q) } else { 0 }),
            by_path: std::array::from_fn(|p| r.by_path(p)),
        },
        refused_matrix: std::array::from_fn(|p| {
            std::array::from_fn(|q| if q < reason::COUNT { r.refused[p * reason::COUNT + q] } else { 0 })
        }),
        would_refuse: r.would_refuse.iter().sum(),
        would_refuse_by: RefusalRow {
            by_reason: std::array::from_fn(|q| if q < reason::COUNT { r.would_refuse[q] } else { 0 }),
            by_path: [0; path::COUNT],
        },
        trusted_admitted: r.trusted_admitted,
        sources: 0,
        shedding: None,
        shed_probes: 0,
    }
}

/// Adds what the coupled shedding did on the row's port, and its flag if
/// raised (`now`: `CLOCK_BOOTTIME` nanoseconds).
fn add_shedding(row: &mut PortRow, flag: &ShedPort, counts: Option<&ShedCounts>, now: u64) {
    if flag.until_boot_ns != 0 {
        row.shedding = Some(ShedRow {
            expires_in_ms: flag.until_boot_ns.saturating_sub(now) / 1_000_000,
            dry_run: flag.flags & SHED_FLAG_DRY_RUN != 0,
            probe_one_in: flag.probe_one_in,
        });
    }
    let Some(c) = counts else { return };
    let shed: u64 = c.refused.iter().sum();
    row.refused += shed;
    row.refused_by.by_reason[reason::SHED] = shed;
    for (p, n) in c.refused.iter().enumerate() {
        row.refused_by.by_path[p] += *n;
        row.refused_matrix[p][reason::SHED] = *n;
    }
    row.would_refuse += c.would_refuse;
    row.would_refuse_by.by_reason[reason::SHED] = c.would_refuse;
    row.trusted_admitted += c.trusted_admitted;
    row.shed_probes = c.probes;
}

/// A gate of one dry-run port that has refused, and would refuse, for
/// every reason on every path, with dry-run shedding: what the readers'
/// tests render (each count distinct).
#[cfg(test)]
pub(crate) fn every_refusal() -> Snapshot {
    let mut r = Refusals::default();
    for (k, n) in r.refused.iter_mut().enumerate() {
        *n = 1 + k as u64;
    }
    for (k, n) in r.would_refuse.iter_mut().enumerate() {
        *n = 10 + k as u64;
    }
    let limit = PortLimit { max_established: 10, flags: LIMIT_FLAG_DRY_RUN, per_source_max: 2, _pad: 0 };
    let mut port = row(8080, Some(&limit), &PortStats::default(), Some(&r));
    let counts = ShedCounts { refused: [20, 21], would_refuse: 22, probes: 1, trusted_admitted: 0 };
    let flag = ShedPort { until_boot_ns: 2_000_000, flags: SHED_FLAG_DRY_RUN, probe_one_in: 16 };
    add_shedding(&mut port, &flag, Some(&counts), 1_000_000);
    Snapshot {
        pin_path: PathBuf::from("/sys/fs/bpf/limiter"),
        layout_version: limiter_common::LAYOUT_VERSION,
        netns_cookie: 1,
        untracked_sockets: 0,
        untracked_sources: 0,
        walked: 0,
        connection_slots: 4096,
        source_prefix_v4: 32,
        source_prefix_v6: 128,
        source_slots: 16,
        source_slots_used: 0,
        source_read_calls: 0,
        trusted: Vec::new(),
        trusted_reserve: 0,
        links: Vec::new(),
        ports: vec![port],
        top_sources: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
