//! The PostgreSQL backend through the public backend kit (`bucket4rs-testkit`): once on the
//! shared server in a table of its own (the conformance runner of CI's `replays` pass), once
//! on a cluster of the test's own that the kit's fault checks stop, freeze and restart (CI's
//! `fault_` pass).

use std::sync::{Arc, Mutex};

use bucket4rs_distributed::{BackendError, PostgresBackend, PostgresOptions};
use bucket4rs_testkit::{BackendKit, Fault, Faults};

use super::{Table, backend, url};
use crate::common::runtime;
use crate::fault::{own_backend, started};
use crate::own::OwnPostgres;

/// A kit whose every client is a backend of its own (a pool of at most 4 connections) on
/// `table` at `url`; the clients it made, in order (the kit's first client replays the
/// traces, alone).
fn kit(
    url: String,
    table: &str,
) -> (
    BackendKit<PostgresBackend>,
    Arc<Mutex<Vec<PostgresBackend>>>,
) {
    let options = PostgresOptions::default()
        .max_connections(4)
        .table(table)
        .expect("a valid table name");
    let clients = Arc::new(Mutex::new(Vec::new()));
    let made = Arc::clone(&clients);
    let kit = BackendKit::new("postgres", move || {
        let (url, options, made) = (url.clone(), options.clone(), Arc::clone(&made));
        async move {
            let backend = PostgresBackend::connect(&url, options).await?;
            made.lock().expect("clients").push(backend.clone());
            Ok::<_, BackendError>(backend)
        }
    });
    (kit, clients)
}

/// Every promise of the backend trait on the shared server; the fault checks are not run
/// there (the shared server is never stopped). The replaying client alone, every operation
/// is one statement: no conflict.
#[test]
fn the_postgres_backend_replays_the_backend_kit() {
    let table = Table::new("kit");
    runtime().block_on(backend(&table)); // migrated
    let (kit, clients) = kit(url(), &table.name);
    kit.run();
    let clients = clients.lock().expect("clients");
    let stats = clients.first().expect("the kit connected").stats();
    println!("postgres conformance stats: {stats:?}");
    assert_eq!(stats.conflicts, 0, "{stats:?}");
}

/// Breaks a cluster of the kit's own: `pg_ctl stop -m immediate` (stop, restart), `pg_ctl
/// start`, SIGSTOP / SIGCONT to every process of the cluster (freeze, thaw).
struct PostgresFaults(OwnPostgres);

#[async_trait::async_trait]
impl Faults for PostgresFaults {
    async fn inject(&self, fault: Fault) -> Result<bool, String> {
        let server = &self.0;
        // pg_ctl waits for the server: off the kit's runtime workers.
        tokio::task::block_in_place(|| {
            match fault {
                Fault::Stop => server.stop("immediate"),
                Fault::Start => server.start(),
                Fault::Freeze => {
                    if server.signal("STOP") == 0 {
                        return Err("no process of the cluster found".to_owned());
                    }
                }
                Fault::Thaw => drop(server.signal("CONT")),
                Fault::Restart => {
                    server.stop("immediate");
                    server.start();
                }
                _ => return Ok(false),
            }
            Ok(true)
        })
    }
}

/// Every promise of the backend trait, the fault checks included (`stopped`, `frozen`,
/// `restart`), on a cluster of the test's own.
#[test]
fn fault_the_postgres_backend_keeps_the_kit_promises_when_stopped_frozen_and_restarted() {
    let server = started();
    let table = "kit";
    super::multi_thread().block_on(own_backend(&server, table, PostgresOptions::default()));
    let (kit, _) = kit(server.url(), table);
    kit.faults(PostgresFaults(server)).run();
}
