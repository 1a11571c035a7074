//! A resource that checks fencing tokens: the other half of
//! `etcd_lock_holder` (see that example's documentation and
//! docs/event-contract.md, "From Rust").
//!
//! It listens on TCP and takes one write per line:
//! `WRITE <lease_id> <token> <holder_id>`. It keeps, per lease, the
//! highest token it has accepted; a write whose token is below it is
//! refused (`REJECTED <max>`), any other accepted (`OK`). Each write is
//! reported through `leaseline-emit` with `source = "resource"`:
//! `write_accepted`, or `stale_write_rejected` with `max_token`.
//!
//! `--no-fencing` turns the check off: every write is accepted, which is
//! what lets a paused holder's stale write through (leaseline then reports
//! `stale_write_accepted` and `write_after_loss`).
//!
//! ```sh
//! cargo run --example fenced_resource -- --listen 127.0.0.1:7000 \
//!   --brokers localhost:9092 --topic lease-events
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use leaseline_emit::{Emitter, KafkaSink, Kind, Source};

#[derive(Parser)]
struct Args {
    /// Where to listen; port 0 picks a free one (the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Kafka brokers for the events.
    #[arg(long)]
    brokers: String,
    #[arg(long, default_value = "lease-events")]
    topic: String,
    /// Accept every write, whatever its token.
    #[arg(long)]
    no_fencing: bool,
}

/// The verdict on one write, given the highest token accepted so far.
fn check(fencing: bool, max: Option<u64>, token: u64) -> Result<(), u64> {
    match max {
        Some(m) if fencing && token < m => Err(m),
        _ => Ok(()),
    }
}

struct Resource {
    fencing: bool,
    /// Highest token accepted, per lease.
    max: Mutex<HashMap<String, u64>>,
    emitter: Emitter,
}

impl Resource {
    fn write(&self, lease_id: &str, token: u64, holder: &str) -> String {
        let mut max = self.max.lock().unwrap();
        let seen = max.get(lease_id).copied();
        let verdict = check(self.fencing, seen, token);
        let (reply, event) = match verdict {
            Ok(()) => {
                let m = max.entry(lease_id.to_string()).or_insert(token);
                *m = (*m).max(token);
                (
                    "OK".to_string(),
                    self.emitter.event(Kind::WriteAccepted, lease_id),
                )
            }
            Err(m) => (
                format!("REJECTED {m}"),
                self.emitter
                    .event(Kind::StaleWriteRejected, lease_id)
                    .max_token(m),
            ),
        };
        if let Err(e) = event.fencing_token(token).holder_id(holder).send() {
            eprintln!("event not sent: {e}");
        }
        println!("{lease_id} token {token} from {holder}: {reply}");
        reply
    }

    fn serve(&self, stream: TcpStream) {
        let mut out = match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            let parts: Vec<&str> = line.split_whitespace().collect();
            let reply = match parts.as_slice() {
                ["WRITE", lease, token, holder] => match token.parse::<u64>() {
                    Ok(t) => self.write(lease, t, holder),
                    Err(_) => "ERR token".to_string(),
                },
                _ => "ERR usage: WRITE <lease_id> <token> <holder_id>".to_string(),
            };
            if writeln!(out, "{reply}").is_err() {
                return;
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut kc = rdkafka::ClientConfig::new();
    kc.set("bootstrap.servers", &args.brokers);
    let sink = KafkaSink::new(kc, &args.topic, 10_000)?;
    let resource = Arc::new(Resource {
        fencing: !args.no_fencing,
        max: Mutex::new(HashMap::new()),
        emitter: Emitter::new(Source::Resource, sink),
    });
    let listener = TcpListener::bind(&args.listen)?;
    println!(
        "listening on {} (fencing {})",
        listener.local_addr()?,
        if resource.fencing { "on" } else { "off" }
    );
    // Events reach the broker within a second of each write.
    let flusher = resource.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        let _ = flusher.emitter.flush(Duration::from_secs(5));
    });
    for stream in listener.incoming().flatten() {
        let r = resource.clone();
        std::thread::spawn(move || r.serve(stream));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn a_token_below_the_highest_is_refused_only_when_fencing() {
        assert_eq!(check(true, None, 3), Ok(()));
        assert_eq!(check(true, Some(3), 3), Ok(()));
        assert_eq!(check(true, Some(5), 3), Err(5));
        assert_eq!(check(false, Some(5), 3), Ok(()));
    }
}
