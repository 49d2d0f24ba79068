//! PostgreSQL out of resources, on a cluster of the test's own (never the shared one): every
//! connection slot taken by other sessions, and a server that refuses writes. Calls fail
//! within the manager's timeout with `Backend(Unavailable)`, change nothing, and work again
//! once the resource is back. Each test prints what it measured (`fault: …`).

use std::time::{Duration, Instant};

use bucket4rs_distributed::{
    BackendErrorKind, DistributedError, PostgresBackend, PostgresOptions, ProxyManager,
};

use crate::common::simple;
use crate::fault::{own_backend, row, started, tokens};
use crate::own::OwnPostgres;
use crate::raw_at;

/// The kind of a failed call's error, or a panic naming what it was instead.
fn kind_of(r: &Result<bool, DistributedError>) -> BackendErrorKind {
    match r {
        Err(DistributedError::Backend(b)) => b.kind(),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// Calls `try_consume(1)` until one succeeds (at most `within`); how long that took and how
/// many calls failed on the way (each checked to be a typed "unavailable" error).
async fn until_granted(
    b: &bucket4rs_distributed::RemoteBucket<PostgresBackend>,
    within: Duration,
) -> (Duration, u32) {
    let t = Instant::now();
    let mut failed = 0;
    loop {
        match b.try_consume(1).await {
            Ok(granted) => {
                assert!(granted, "the bucket ran out while recovering");
                return (t.elapsed(), failed);
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                failed += 1;
            }
        }
        assert!(t.elapsed() < within, "no recovery within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every connection slot taken: the cluster runs with `max_connections = 5` and no superuser
/// reserve, the backend's pooled connections are terminated, and other sessions (plain
/// `tokio_postgres` connections) take every free slot, so the server answers each new
/// connection with `53300 too_many_connections`. Every call then fails well within the
/// manager's timeout with `Backend(Unavailable)` (the first ones from the refused connection,
/// the later ones from the opened circuit breaker), and `PostgresBackend::connect` fails the
/// same way; nothing is charged and the row is untouched. Once the other sessions close, the
/// next calls succeed (after at most one probe interval of the breaker).
#[test]
fn fault_postgres_connection_slots_exhausted_fail_typed_and_charge_nothing() {
    let server = OwnPostgres::init();
    server.start_with("-c max_connections=5 -c superuser_reserved_connections=0");
    let rt = crate::multi_thread();
    rt.block_on(async {
        let table = "slots";
        let options = PostgresOptions::default().max_connections(2);
        let (backend, raw) = own_backend(&server, table, options.clone()).await;
        let timeout = Duration::from_millis(1_000);
        let manager = ProxyManager::configure(backend.clone())
            .timeout(timeout)
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000_000)))
            .unwrap();
        let mut granted = 0i64;
        for _ in 0..3 {
            assert!(b.try_consume(1).await.unwrap());
            granted += 1;
        }
        let key = b.key().as_str().to_owned();
        let before = row(&raw, table, &key).await.unwrap();

        // The backend's pool keeps no open connection: the server ends them.
        raw.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'bucket4rs'",
            &[],
        )
        .await
        .unwrap();
        let by = Instant::now() + Duration::from_secs(5);
        loop {
            let left: i64 = raw
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bucket4rs'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                break;
            }
            assert!(Instant::now() < by, "{left} backend connections survived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Until the client side has seen its connections end.
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Other sessions take every free slot.
        let mut hogs = Vec::new();
        let refusal = loop {
            match tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await {
                Ok((client, conn)) => {
                    tokio::spawn(conn);
                    hogs.push(client);
                    assert!(hogs.len() <= 5, "max_connections = 5 not in force");
                }
                Err(e) => break e,
            }
        };
        assert_eq!(
            refusal.code(),
            Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS),
            "{refusal}"
        );

        // A backend created now: created at once, its calls refused as the server refuses
        // its connections (53300), retryably.
        let late = PostgresBackend::connect(&server.url(), options.clone().table(table).unwrap())
            .await
            .unwrap();
        let refused = bucket4rs_distributed::Backend::read(&late, b.key())
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), BackendErrorKind::Unavailable, "{refused}");
        assert!(refused.is_retryable(), "{refused}");

        let t = Instant::now();
        let mut slowest = Duration::ZERO;
        let mut first = None;
        let calls = 12;
        for _ in 0..calls {
            let t = Instant::now();
            let r = b.try_consume(1).await;
            slowest = slowest.max(t.elapsed());
            assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
            assert_eq!(kind_of(&r), BackendErrorKind::Unavailable, "{r:?}");
            first.get_or_insert_with(|| r.unwrap_err().to_string());
        }
        let failing = t.elapsed();
        let first = first.unwrap();
        assert!(first.contains("53300"), "{first}");
        assert!(slowest < timeout, "a call took {slowest:?}");
        let during = row(&raw, table, &key).await.unwrap();
        assert_eq!(during, before, "the row changed while the slots were taken");

        let freed = hogs.len();
        drop(hogs);
        let (recovered, failed_after) = until_granted(&b, Duration::from_secs(10)).await;
        granted += 1;
        for _ in 0..4 {
            assert!(b.try_consume(1).await.unwrap());
            granted += 1;
        }
        let left = b.available_tokens().await.unwrap();
        println!(
            "fault: postgres connection slots exhausted: {calls} calls failed in {:?} ms \
             (slowest {slowest:?}, timeout {timeout:?}; typed: Backend(Unavailable), first \
             \"{first}\"; a backend created now: {:?} retryable), tokens charged 0; recovered after {freed} \
             slots freed in {} ms ({failed_after} more failed calls); granted {granted}, \
             charged {} of 100",
            failing.as_millis(),
            refused.kind(),
            recovered.as_millis(),
            100 - left
        );
        assert_eq!(
            left,
            100 - granted,
            "charged other than the successful calls"
        );
        let stored = row(&raw, table, &key).await.unwrap();
        assert_eq!(tokens(&stored.0), left);
        assert_eq!(stored.1, before.1 + 5, "one version per successful write");
    });
}

/// Sets `default_transaction_read_only` for the whole cluster (`ALTER SYSTEM` +
/// `pg_reload_conf()`) and waits until a session that has no setting of its own sees it.
async fn read_only(admin: &tokio_postgres::Client, observer: &tokio_postgres::Client, on: bool) {
    if on {
        admin
            .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
            .await
            .unwrap();
    } else {
        admin
            .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
            .await
            .unwrap();
    }
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let want = if on { "on" } else { "off" };
    let by = Instant::now() + Duration::from_secs(5);
    loop {
        let now: String = observer
            .query_one("SHOW default_transaction_read_only", &[])
            .await
            .unwrap()
            .get(0);
        if now == want {
            break;
        }
        assert!(
            Instant::now() < by,
            "default_transaction_read_only stayed {now}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes refused: the cluster is made read-only (`ALTER SYSTEM SET
/// default_transaction_read_only = on` + `pg_reload_conf()`), so every write fails with
/// `25006 read_only_sql_transaction` — what a hot standby answers after a failover, and the
/// nearest honest stand-in for a server that cannot write (a full disk answers `53100` or
/// stops; this test does not fill a disk). On the one-statement path and the locking
/// fallback, for a key that exists and one that does not: every consuming call fails with
/// `Backend(Unavailable)`, the existing row keeps its bytes, version and expiry, the new key
/// gets no row. Once writes are allowed again, calls work and exactly
/// the successful ones were charged.
#[test]
fn fault_postgres_writes_refused_read_only_fail_typed_and_change_nothing() {
    let server = started();
    let rt = crate::multi_thread();
    rt.block_on(async {
        let table = "read_only";
        let admin = raw_at(&server.url()).await;
        // The admin session keeps writing (a session setting outranks the file's).
        admin
            .batch_execute("SET default_transaction_read_only = off")
            .await
            .unwrap();
        let mut report = Vec::new();
        for rounds in [2, 0] {
            let options = PostgresOptions::default().optimistic_rounds(rounds);
            let (backend, observer) = own_backend(&server, table, options).await;
            let timeout = Duration::from_millis(1_000);
            let manager = ProxyManager::configure(backend)
                .timeout(timeout)
                .build()
                .unwrap();
            let config = || simple(100, Duration::from_secs(100));
            let old = manager.builder().build(format!("old{rounds}"), config).unwrap();
            let new = manager.builder().build(format!("new{rounds}"), config).unwrap();
            let mut granted = 0i64;
            for _ in 0..2 {
                assert!(old.try_consume(1).await.unwrap());
                granted += 1;
            }
            let old_key = old.key().as_str().to_owned();
            let before = row(&admin, table, &old_key).await.unwrap();
            assert!(before.2.is_some(), "a full-refilling bucket has an expiry");

            read_only(&admin, &observer, true).await;
            let t = Instant::now();
            let mut slowest = Duration::ZERO;
            let mut first = None;
            let calls = 8;
            for i in 0..calls {
                let b = if i % 2 == 0 { &old } else { &new };
                let t = Instant::now();
                let r = b.try_consume(1).await;
                slowest = slowest.max(t.elapsed());
                assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
                assert_eq!(kind_of(&r), BackendErrorKind::Unavailable, "{r:?}");
                first.get_or_insert_with(|| r.unwrap_err().to_string());
            }
            let failing = t.elapsed();
            let first = first.unwrap();
            assert!(first.contains("25006"), "{first}");
            assert!(slowest < timeout, "a call took {slowest:?}");
            assert_eq!(
                row(&admin, table, &old_key).await.unwrap(),
                before,
                "rounds {rounds}: the row changed while writes were refused"
            );
            assert_eq!(row(&admin, table, new.key().as_str()).await, None);

            read_only(&admin, &observer, false).await;
            let (recovered, failed_after) = until_granted(&old, Duration::from_secs(10)).await;
            granted += 1;
            assert!(new.try_consume(1).await.unwrap());
            let left = old.available_tokens().await.unwrap();
            assert_eq!(left, 100 - granted, "rounds {rounds}");
            assert_eq!(new.available_tokens().await.unwrap(), 99, "rounds {rounds}");
            let after = row(&admin, table, &old_key).await.unwrap();
            assert_eq!(after.1, before.1 + 1, "rounds {rounds}");
            assert_eq!(tokens(&after.0), left);
            report.push(format!(
                "{} path: {calls} calls failed in {} ms (slowest {slowest:?}; typed: \
                 Backend(Unavailable), first \"{first}\"), row unchanged, tokens charged 0; recovered in {} ms ({failed_after} more failed \
                 calls), charged {} of 100 for {granted} grants",
                if rounds == 0 { "locking" } else { "optimistic" },
                failing.as_millis(),
                recovered.as_millis(),
                100 - left
            ));
        }
        for line in report {
            println!("fault: postgres writes refused (read-only cluster): {line}");
        }
    });
}
