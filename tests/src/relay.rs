//! A TCP relay that delays every chunk by a fixed time each way: a store
//! "far away" on a machine whose kernel has no netem. It listens in a
//! namespace the test names and connects on to the real address from
//! there; each direction of each connection keeps its order, and a chunk
//! goes on `delay` after it came.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use nix::sched::{CloneFlags, setns};

/// A running relay; stops accepting when dropped.
pub struct Relay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Relays `listen` (in the namespace of `netns`) to `to`, each chunk
    /// `delay` late in each direction (so a round trip is twice `delay`
    /// longer).
    pub fn start(netns: &std::fs::File, listen: SocketAddr, to: SocketAddr, delay: Duration) -> Self {
        let netns = netns.try_clone().expect("dup the namespace's fd");
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let stopping = stop.clone();
        thread::spawn(move || {
            use std::os::fd::AsFd as _;
            setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
            let listener = TcpListener::bind(listen).expect("the relay's port");
            listener.set_nonblocking(true).unwrap();
            ready_tx.send(listener.local_addr().unwrap()).unwrap();
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        // Created on this thread: in the namespace.
                        let Ok(server) = TcpStream::connect(to) else { continue };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        pipe(client.try_clone().unwrap(), server.try_clone().unwrap(), delay);
                        pipe(server, client, delay);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        let addr = ready_rx.recv_timeout(Duration::from_secs(5)).expect("the relay listens");
        Self { addr, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                return;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}
