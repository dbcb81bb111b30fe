//! A claim as it crosses to the store and back: what a node asks of the
//! claim script (`claim.lua`, whose header is the contract) and what the
//! script answers, in the script's own words. The daemon and the fleet's
//! simulation (`sim/`) both speak to the script through this file only.

use std::{fmt::Write as _, sync::Arc, time::Instant};

use tokio::sync::watch;

use crate::admission::Refusal;

/// Which budget a key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Session,
    Web,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Web => "web",
        }
    }

    /// The refusal of this budget's limit.
    pub fn refusal(self) -> Refusal {
        match self {
            Self::Session => Refusal::FleetSession,
            Self::Web => Refusal::FleetWeb,
        }
    }
}

/// The script, as the daemon loads it (and the simulation runs it).
pub const SCRIPT: &str = include_str!("claim.lua");

/// One claim of one budget (or, with no budget, of its group's epoch).
#[derive(Debug)]
pub struct Claim {
    /// The budget's key; `None`: the epoch alone (`group`).
    pub key: Option<Arc<str>>,
    /// The key of the budget's group's epoch.
    pub group: Arc<str>,
    pub kind: Kind,
    /// This node's claims only ever grow it.
    pub seq: u64,
    pub in_use: u32,
    /// What this node admits up to until the answer (at most what it
    /// may admit now: a share only shrinks before the store hears of it).
    pub keep: u32,
    pub need: u32,
    pub want: u32,
    /// Other nodes' fields this node has seen unchanged for a lease, with
    /// the sequence number it saw.
    pub gone: Vec<(String, u64)>,
    /// The quiet this node has seen for a lease (`None`: none).
    pub unquiet: Option<String>,
    /// A nonce for an epoch this claim may make (drawn by the node).
    pub nonce: u64,
    /// Whether requests beyond the share sent it (else a renewal).
    pub growth: bool,
    /// When it was made (sent).
    pub sent: Instant,
    /// The share had lapsed here (this node's clock) with requests in
    /// flight: a pause, a partition, a store away longer than the trust.
    pub lapsed: bool,
    /// The share's trust left when it was made (for the margin metric).
    pub margin: Option<std::time::Duration>,
    /// Dropped (or sent to) when the claim ends: the requests waiting
    /// for it look again.
    pub done: watch::Sender<()>,
}

impl Claim {
    /// The script's `KEYS`.
    pub fn keys(&self) -> Vec<&str> {
        match &self.key {
            Some(k) => vec![k, &self.group],
            None => vec![&self.group],
        }
    }

    /// The script's `ARGV`, for this node's field `me`, a budget of
    /// `limit`, keys that live `ttl_ms` without a claim, budgets wanted
    /// told on `channel`, a budget of given-back fields kept `tomb_ms` (0
    /// for the live nodes' hash: a field given back goes at once).
    pub fn argv(&self, me: &str, limit: u32, ttl_ms: u64, channel: &str, tomb_ms: u64) -> Vec<String> {
        let mut gone = String::new();
        for (f, s) in &self.gone {
            let _ = write!(gone, "{}{f} {s}", if gone.is_empty() { "" } else { " " });
        }
        vec![
            me.to_owned(),
            self.seq.to_string(),
            limit.to_string(),
            self.in_use.to_string(),
            self.keep.to_string(),
            self.need.to_string(),
            self.want.to_string(),
            gone,
            self.unquiet.clone().unwrap_or_else(|| "-".to_owned()),
            ttl_ms.to_string(),
            self.nonce.to_string(),
            channel.to_owned(),
            tomb_ms.to_string(),
        ]
    }
}

/// The channel the script tells of a budget wanted on, in fleet `name`.
pub fn wanted_channel(name: &str) -> String {
    format!("limiter:{{{name}}}:wanted")
}

/// The script's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// An older claim than one the store has: nothing changed.
    pub stale: bool,
    pub seq: u64,
    /// What this node may admit up to now.
    pub cap: u32,
    /// What the store counts for this node (at least its requests in
    /// flight and what it kept).
    pub share: u32,
    /// The group's quiet (`None`: not quiet): the store lost data, no
    /// share grows until a node has seen it for a lease.
    pub quiet: Option<String>,
    pub generation: u64,
    /// The other nodes' shares, and what they asked for beyond them.
    pub others: u32,
    pub others_demand: u32,
    /// The budget held this node's field before this claim.
    pub had: bool,
    /// What the others hold beyond what they had in flight at their last
    /// claim: theirs to give back, soon when they are told it is wanted.
    pub spare: u32,
    /// The other nodes' fields and their sequence numbers.
    pub seen: Vec<(String, u64)>,
}

impl Answer {
    /// Reads the script's answer; `Err` says what was not understood.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("the claim script answered {text:?}");
        let num = |words: &mut dyn Iterator<Item = &str>| {
            words.next().and_then(|w| w.parse::<u64>().ok()).ok_or_else(bad)
        };
        let mut words = text.split(' ').filter(|w| !w.is_empty());
        let stale = match words.next() {
            Some("ok" | "epoch") => false,
            Some("stale") => true,
            _ => return Err(bad()),
        };
        let (seq, cap, share) = (num(&mut words)?, num(&mut words)?, num(&mut words)?);
        let quiet = match words.next() {
            Some("-") => None,
            Some(q)
                if q.split_once('.')
                    .is_some_and(|(n, g)| n.parse::<u64>().is_ok() && g.parse::<u64>().is_ok()) =>
            {
                Some(q.to_owned())
            }
            _ => return Err(bad()),
        };
        let (gen_, others, others_demand, had, spare) =
            (num(&mut words)?, num(&mut words)?, num(&mut words)?, num(&mut words)?, num(&mut words)?);
        let to32 = |n: u64| u32::try_from(n).map_err(|_| bad());
        let mut seen = Vec::new();
        let rest: Vec<&str> = words.collect();
        for pair in rest.chunks(2) {
            let [f, s] = pair else { return Err(bad()) };
            seen.push(((*f).to_owned(), s.parse::<u64>().map_err(|_| bad())?));
        }
        Ok(Self {
            stale,
            seq,
            cap: to32(cap)?,
            share: to32(share)?,
            quiet,
            generation: gen_,
            others: to32(others)?,
            others_demand: to32(others_demand)?,
            had: had == 1,
            spare: to32(spare)?,
            seen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_back() {
        let a = Answer::parse("ok 7 3 4 - 2 5 1 1 0 ab.01 6 cd.02 9").unwrap();
        assert_eq!((a.seq, a.cap, a.share, a.generation, a.others, a.others_demand), (7, 3, 4, 2, 5, 1));
        assert_eq!(a.quiet, None);
        assert_eq!(a.seen, [("ab.01".to_owned(), 6), ("cd.02".to_owned(), 9)]);
        assert!(!a.stale && a.had);
        assert!(Answer::parse("stale 7 3 4 - 2 5 1 0 2 ").unwrap().stale);
        assert_eq!(Answer::parse("epoch 0 0 0 123.3 3 0 0 0 0").unwrap().quiet.as_deref(), Some("123.3"));
        for bad in [
            "",
            "ok 1 2",
            "nope 1 2 3 - 5 6 7 0 0",
            "ok 1 2 3 - 5 6 7 0 0 f",
            "ok 1 2 99999999999 - 5 6 7 0 0",
            "ok 1 2 3 4 5 6 7 0 0",
        ] {
            assert!(Answer::parse(bad).is_err(), "{bad}");
        }
    }
}
