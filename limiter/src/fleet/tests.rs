//! The fleet's tasks against a scripted store: a loopback listener that
//! speaks enough RESP for limiter's client (`PING`, `SET`, `GET`, the
//! claim script's `EVALSHA`), grants every claim what it wants, and
//! records when each came. No Redis, no root.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{TcpListener, TcpStream},
};

use super::{Fleet, start};
use crate::config::Config;

/// What the store was asked: when, and the command's words.
type Asked = Arc<Mutex<Vec<(Instant, Vec<String>)>>>;

/// A store that answers every connection until the test ends; `stalled`:
/// it stops answering claims (a store gone quiet) while set.
struct Scripted {
    addr: String,
    asked: Asked,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl Scripted {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let asked = Asked::default();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, s) = (asked.clone(), stalled.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, a.clone(), s.clone()));
            }
        });
        Self { addr, asked, stalled }
    }

    /// The times of the claims (`EVALSHA`) sent since `from`.
    fn claims_since(&self, from: Instant) -> Vec<Instant> {
        let asked = self.asked.lock().unwrap();
        asked
            .iter()
            .filter(|(at, w)| *at >= from && w[0].eq_ignore_ascii_case("evalsha"))
            .map(|a| a.0)
            .collect()
    }
}

/// One connection: RESP arrays of bulk strings in, scripted answers out.
async fn serve(stream: TcpStream, asked: Asked, stalled: Arc<std::sync::atomic::AtomicBool>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let Some(words) = command(&mut read).await else { return };
        asked.lock().unwrap().push((Instant::now(), words.clone()));
        let reply = match words[0].to_ascii_uppercase().as_str() {
            "PING" => "+PONG\r\n".to_owned(),
            "GET" => "$-1\r\n".to_owned(),
            "PTTL" => ":1000\r\n".to_owned(),
            // EVALSHA sha numkeys keys… me seq limit in_use keep need want
            // …: the cap granted is what is wanted.
            "EVALSHA" if stalled.load(std::sync::atomic::Ordering::Relaxed) => continue,
            "EVALSHA" => {
                let argv = 3 + words[2].parse::<usize>().unwrap_or(1);
                let (seq, want) = (&words[argv + 1], &words[argv + 6]);
                let text = format!("ok {seq} {want} {want} - 1 0 0 1 0");
                format!("${}\r\n{text}\r\n", text.len())
            }
            _ => "+OK\r\n".to_owned(),
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn command(read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<Vec<String>> {
    let mut line = String::new();
    read.read_line(&mut line).await.ok()?;
    let n: usize = line.strip_prefix('*')?.trim().parse().ok()?;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let len: usize = line.strip_prefix('$')?.trim().parse().ok()?;
        let mut word = vec![0u8; len + 2];
        read.read_exact(&mut word).await.ok()?;
        word.truncate(len);
        words.push(String::from_utf8_lossy(&word).into_owned());
    }
    Some(words)
}

const LEASE: Duration = Duration::from_millis(300);

async fn fleet(store: &Scripted) -> Arc<Fleet> {
    let text = format!(
        "http.upstream = 127.0.0.1:9\nfleet.store = redis://{}\nfleet.leaseMs = {}\nfleet.maxWebConnections = 1000\nfleet.timeoutMs = 50\n",
        store.addr,
        LEASE.as_millis()
    );
    let config = Config::parse(&text, "fleet.ini").unwrap();
    start(&config.fleet, "node-a").await.unwrap().expect("fleet.store is set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_come_every_third_of_the_lease_while_releases_pour_in() {
    let store = Scripted::start().await;
    let fleet = fleet(&store).await;
    let (held, refused) = fleet.acquire(true, None).await;
    assert!(held.is_some() && refused.is_none(), "the first unit is claimed and granted");
    // Requests come and go as fast as they can beside the one held.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = (0..2)
        .map(|_| {
            let (fleet, stop) = (fleet.clone(), stop.clone());
            tokio::spawn(async move {
                let mut released = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (units, _) = fleet.acquire(true, None).await;
                    drop(units);
                    released += 1;
                    if released.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                released
            })
        })
        .collect::<Vec<_>>();
    let from = Instant::now();
    tokio::time::sleep(LEASE * 6).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut released = 0;
    for c in churn {
        released += c.await.unwrap();
    }
    let claims = store.claims_since(from);
    let gaps: Vec<Duration> = claims.windows(2).map(|w| w[1] - w[0]).collect();
    let text =
        format!("{released} releases; claims at {:?}", claims.iter().map(|c| *c - from).collect::<Vec<_>>());
    assert!(released > 1000, "{text}");
    // A round every 100 ms: 18 in 1.8 s. Late by the lease's third would
    // leave a gap of 200 ms; a share lapses after 300.
    assert!(claims.len() >= 12, "{text}");
    assert!(gaps.iter().all(|g| *g < LEASE * 2 / 3), "{text}");
    let snap = fleet.snapshot();
    assert_eq!(snap.lease_lapsed, 0, "{text}");
    assert!(snap.lease_margin_ms.is_some_and(|m| m > LEASE.as_millis() as f64 / 3.0), "{snap:?}");
    eprintln!("{text}; least lease left {:?} ms", snap.lease_margin_ms);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_is_marked_down_and_found_back_by_the_probe() {
    let store = Scripted::start().await;
    let fleet = fleet(&store).await;
    let (held, _) = fleet.acquire(true, None).await;
    assert!(held.is_some());
    store.stalled.store(true, std::sync::atomic::Ordering::Relaxed);
    let until = |want: bool| {
        let fleet = fleet.clone();
        async move {
            for _ in 0..300 {
                if fleet.snapshot().up == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the store is not {} after 3 s: {:?}", if want { "up" } else { "down" }, fleet.snapshot());
        }
    };
    // A renewal gets no answer within a third of the lease: down.
    until(false).await;
    assert!(fleet.snapshot().store_failures >= 1);
    store.stalled.store(false, std::sync::atomic::Ordering::Relaxed);
    let back = Instant::now();
    until(true).await;
    // Republished before it counts as up: a claim went out after the probe.
    assert!(!store.claims_since(back).is_empty());
    drop(held);
}
