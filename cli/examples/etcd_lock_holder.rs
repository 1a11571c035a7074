//! An etcd lock holder that keeps the contract's discipline
//! (docs/event-contract.md, "The discipline the rules assume"), reporting
//! every step through `leaseline-emit`. Its resource is `fenced_resource`.
//!
//! - It takes a lease of `--ttl` seconds and contends for the lock as etcd's
//!   `concurrency.Mutex` does: it puts `<prefix><lock>/<lease hex>` (value:
//!   its holder id) attached to the lease, and owns the lock once its key
//!   has the lowest create revision under `<prefix><lock>/` (it polls every
//!   100 ms). Its fencing token is that create revision, the token
//!   `leaseline watch etcd` reports for the same grant, and its events'
//!   `lease_id` is `<lock>`, the watcher's too.
//! - It renews every TTL/3, ±10 % jitter, and notes on the monotonic clock
//!   when it **sent** each keepalive that succeeded.
//! - Its fence is the send time of the last good keepalive + TTL − 1 s.
//!   Before each write it checks the fence; past it, or once a keepalive has
//!   failed, it stops writing and reports `fenced`.
//! - The first failed keepalive (an error, no answer within TTL/3, or a TTL
//!   of 0: the lease is gone) starts a drain: `renew_failed`, then
//!   `drain_started` with the fence deadline; it renews no more.
//! - Each write carries its token to the resource, which refuses a token
//!   below the highest it has seen.
//! - After `--writes` writes it releases: it deletes its key (`released`)
//!   and revokes its lease.
//!
//! Events (source `holder`, backend `etcd`, `holder_id` = `--holder`):
//! `acquired` and `renewed` with `keepalive_sent_mono_ms`, `renew_failed`,
//! `drain_started` and `fenced` with `deadline_mono_ms`, `released`; every
//! one with `mono_ms` and an event id fixed when it is built.
//!
//! Two switches exist for demonstrations and tests:
//! - `--no-fencing`: no fence check (the holder writes until it learns its
//!   lease is gone); run the resource with `--no-fencing` too to let a
//!   stale write through;
//! - `--pause-at-write N --pause FOR`: before write N (from 1), after the
//!   fence check passed, it prints `in the write window` and waits `FOR`
//!   before writing. A process stopped in that window (SIGSTOP) past its
//!   TTL and resumed writes with the token it has lost, deterministically:
//!   the paused holder whose stale write the resource must refuse.
//!
//! ```sh
//! cargo run --example etcd_lock_holder -- --endpoints http://127.0.0.1:2379 \
//!   --lock ledger --holder worker-1 --ttl 3 --resource 127.0.0.1:7000 \
//!   --brokers localhost:9092 --topic lease-events
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp,
};
use leaseline_emit::{mono_ms_at, Emitter, KafkaSink, Kind, Source};
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Parser)]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// The key prefix of the locks (as given to `leaseline watch etcd`).
    #[arg(long, default_value = "leases/")]
    prefix: String,
    /// The lock's name: its `lease_id`.
    #[arg(long)]
    lock: String,
    /// This holder's id: the key's value and every event's `holder_id`.
    #[arg(long)]
    holder: String,
    /// The lease's TTL, seconds.
    #[arg(long, default_value_t = 3)]
    ttl: i64,
    /// The fenced resource, `host:port`.
    #[arg(long)]
    resource: String,
    #[arg(long)]
    brokers: String,
    #[arg(long, default_value = "lease-events")]
    topic: String,
    /// Writes to make while holding the lock, then release.
    #[arg(long, default_value_t = 5)]
    writes: u32,
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    write_interval: Duration,
    /// Do not stop at the local fence.
    #[arg(long)]
    no_fencing: bool,
    /// Wait in the write window before this write (from 1).
    #[arg(long, requires = "pause")]
    pause_at_write: Option<u32>,
    #[arg(long, value_parser = humantime::parse_duration)]
    pause: Option<Duration>,
}

/// What the keepalive task and the work loop share.
struct Lease {
    /// When the last keepalive that succeeded was sent (the grant at
    /// first).
    last_good: Mutex<Instant>,
    /// A keepalive failed: draining.
    lost: AtomicBool,
    /// The token once the lock is held (0 before).
    token: AtomicU64,
}

/// The local fence: the send time of the last good keepalive + TTL − 1 s.
fn fence_at(last_good: Instant, ttl: Duration) -> Instant {
    last_good + ttl.saturating_sub(Duration::from_secs(1))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn keepalive(
    mut keeper: LeaseKeeper,
    mut answers: LeaseKeepAliveStream,
    lease: Arc<Lease>,
    em: Emitter,
    lease_id: String,
    ttl: Duration,
) {
    let period = ttl / 3;
    loop {
        let jitter = rand::rng().random_range(-0.1..=0.1);
        tokio::time::sleep(period.mul_f64(1.0 + jitter)).await;
        let sent = Instant::now();
        let answer = tokio::time::timeout(period, async {
            keeper.keep_alive().await?;
            answers.message().await
        })
        .await;
        let failure = match answer {
            Ok(Ok(Some(r))) if r.ttl() > 0 => None,
            Ok(Ok(Some(_))) => Some("lease expired".to_string()),
            Ok(Ok(None)) => Some("keepalive stream closed".to_string()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("timeout".to_string()),
        };
        let token = lease.token.load(Ordering::Acquire);
        match failure {
            None => {
                *lease.last_good.lock().unwrap() = sent;
                if token > 0 {
                    let _ = em
                        .event(Kind::Renewed, &lease_id)
                        .fencing_token(token)
                        .ttl_ms(ttl.as_millis() as u64)
                        .latency_ms(ms(sent.elapsed()))
                        .keepalive_sent_mono_ms(mono_ms_at(sent))
                        .send();
                }
            }
            Some(reason) => {
                lease.lost.store(true, Ordering::Release);
                println!("keepalive failed ({reason}): draining");
                if token > 0 {
                    let fence = fence_at(*lease.last_good.lock().unwrap(), ttl);
                    let _ = em
                        .event(Kind::RenewFailed, &lease_id)
                        .fencing_token(token)
                        .reason(&reason)
                        .latency_ms(ms(sent.elapsed()))
                        .send();
                    let _ = em
                        .event(Kind::DrainStarted, &lease_id)
                        .fencing_token(token)
                        .deadline_mono_ms(mono_ms_at(fence))
                        .send();
                }
                return;
            }
        }
    }
}

/// One write to the resource: its answer line.
async fn write(resource: &str, lease_id: &str, token: u64, holder: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(resource).await?;
    s.write_all(format!("WRITE {lease_id} {token} {holder}\n").as_bytes())
        .await?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).await?;
    Ok(line.trim().to_string())
}

enum End {
    Done,
    Fenced(Instant),
    Lost,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let lease_id = args.lock.clone();
    let ttl = Duration::from_secs(args.ttl.max(2) as u64);
    let mut kc = rdkafka::ClientConfig::new();
    kc.set("bootstrap.servers", &args.brokers);
    let em = Emitter::new(Source::Holder, KafkaSink::new(kc, &args.topic, 10_000)?)
        .holder_id(&args.holder)
        .backend("etcd");

    let mut client = Client::connect(&args.endpoints, None).await?;
    let started = Instant::now();
    let granted = Instant::now();
    let id = client.lease_grant(ttl.as_secs() as i64, None).await?.id();
    let lease = Arc::new(Lease {
        last_good: Mutex::new(granted),
        lost: AtomicBool::new(false),
        token: AtomicU64::new(0),
    });
    let (keeper, answers) = client.lease_keep_alive(id).await?;
    tokio::spawn(keepalive(
        keeper,
        answers,
        lease.clone(),
        em.clone(),
        lease_id.clone(),
        ttl,
    ));

    // Contend as concurrency.Mutex does: a key of our own, then wait
    // until it is the oldest.
    let dir = format!("{}{}/", args.prefix, args.lock);
    let key = format!("{dir}{id:x}");
    client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    args.holder.as_str(),
                    Some(PutOptions::new().with_lease(id)),
                )]),
        )
        .await?;
    let mine = client
        .get(key.as_str(), None)
        .await?
        .kvs()
        .first()
        .map(|kv| kv.create_revision())
        .ok_or_else(|| anyhow::anyhow!("our key {key} is gone"))?;
    println!("waiting for {lease_id} as {key} (create revision {mine})");
    loop {
        anyhow::ensure!(
            !lease.lost.load(Ordering::Acquire),
            "the lease was lost while waiting"
        );
        let first = client
            .get(
                dir.as_str(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )
            .await?;
        if first.kvs().first().map(|kv| kv.create_revision()) == Some(mine) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = mine as u64;
    lease.token.store(token, Ordering::Release);
    let last_good = *lease.last_good.lock().unwrap();
    em.event(Kind::Acquired, &lease_id)
        .fencing_token(token)
        .ttl_ms(ttl.as_millis() as u64)
        .latency_ms(ms(started.elapsed()))
        .keepalive_sent_mono_ms(mono_ms_at(last_good))
        .send()?;
    println!("acquired {lease_id} token {token}");

    let mut n = 0;
    let end = loop {
        tokio::time::sleep(args.write_interval).await;
        let fence = fence_at(*lease.last_good.lock().unwrap(), ttl);
        let lost = lease.lost.load(Ordering::Acquire);
        if args.no_fencing {
            if lost {
                break End::Lost;
            }
        } else if lost || Instant::now() >= fence {
            break End::Fenced(fence);
        }
        if n >= args.writes {
            break End::Done;
        }
        n += 1;
        if let (Some(at), Some(pause)) = (args.pause_at_write, args.pause) {
            if at == n {
                println!("in the write window: write {n} token {token}, writing in {pause:?}");
                tokio::time::sleep(pause).await;
            }
        }
        match write(&args.resource, &lease_id, token, &args.holder).await {
            Ok(answer) => println!("write {n} token {token}: {answer}"),
            Err(e) => println!("write {n} token {token} failed: {e}"),
        }
    };
    match end {
        End::Done => {
            client.delete(key.as_str(), None).await?;
            em.event(Kind::Released, &lease_id)
                .fencing_token(token)
                .send()?;
            client.lease_revoke(id).await?;
            println!("released {lease_id} token {token}");
        }
        End::Fenced(fence) => {
            em.event(Kind::Fenced, &lease_id)
                .fencing_token(token)
                .deadline_mono_ms(mono_ms_at(fence))
                .send()?;
            println!("fenced {lease_id} token {token}");
        }
        End::Lost => println!("lost {lease_id} token {token}; no fence (fencing off)"),
    }
    em.flush(Duration::from_secs(10))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_is_one_second_short_of_the_ttl_from_the_send() {
        let sent = Instant::now();
        assert_eq!(
            fence_at(sent, Duration::from_secs(3)),
            sent + Duration::from_secs(2)
        );
    }
}
