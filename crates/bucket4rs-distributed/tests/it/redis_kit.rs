//! The Redis backend through the public backend kit (`bucket4rs-testkit`): once on the shared
//! server (the conformance runner of CI's `replays` pass), once on a redis-server of the
//! test's own that the kit's fault checks stop, freeze and restart (CI's `fault_` pass).

use std::sync::{Arc, Mutex};

use bucket4rs_distributed::{RedisBackend, RedisOptions};
use bucket4rs_testkit::{BackendKit, Fault, Faults};

use crate::redis_faults::OwnRedis;

/// A kit whose every client is a new connection to `url`; the clients it made, in order (the
/// kit's first client replays the traces, alone).
fn kit(url: String) -> (BackendKit<RedisBackend>, Arc<Mutex<Vec<RedisBackend>>>) {
    let clients = Arc::new(Mutex::new(Vec::new()));
    let made = Arc::clone(&clients);
    let kit = BackendKit::new("redis", move || {
        let (url, made) = (url.clone(), Arc::clone(&made));
        async move {
            let backend = RedisBackend::connect(&url, RedisOptions::default()).await?;
            made.lock().expect("clients").push(backend.clone());
            Ok::<_, bucket4rs_distributed::BackendError>(backend)
        }
    });
    (kit, clients)
}

/// Prints which of the script's paths the conformance client took (the traces decide:
/// `lua_fast_path_is_byte_identical_to_the_core_on_random_states` checks both paths on data
/// of its own).
fn print_conformance_stats(clients: &Mutex<Vec<RedisBackend>>) {
    let clients = clients.lock().expect("clients");
    let first = clients.first().expect("the kit connected");
    println!("redis conformance stats: {:?}", first.stats());
}

/// Every promise of the backend trait on the shared server; the fault checks are not run
/// there (the shared server is never stopped).
#[test]
fn the_redis_backend_replays_the_backend_kit() {
    let (kit, clients) = kit(crate::redis::url());
    kit.run();
    print_conformance_stats(&clients);
}

/// Breaks a redis-server of the kit's own: `kill -9` (stop, restart: the append-only file,
/// fsynced on every write, keeps the data), `kill -STOP` / `-CONT` (freeze, thaw). The last
/// server is the live one; the ones before it are killed, and all are dropped (their
/// directory, the same for all, removed) at the end.
struct RedisFaults {
    servers: Mutex<Vec<OwnRedis>>,
}

#[async_trait::async_trait]
impl Faults for RedisFaults {
    async fn inject(&self, fault: Fault) -> Result<bool, String> {
        // Starting a server waits for its port: off the kit's runtime workers.
        tokio::task::block_in_place(|| {
            let mut servers = self.servers.lock().map_err(|e| e.to_string())?;
            let live = servers.last_mut().ok_or("no server")?;
            let (port, dir) = (live.port, live.dir.clone());
            match fault {
                Fault::Stop => live.kill(),
                Fault::Freeze => live.freeze(),
                Fault::Thaw => live.resume(),
                Fault::Start => servers.push(OwnRedis::start(Some(port), Some(dir))),
                Fault::Restart => {
                    live.kill();
                    servers.push(OwnRedis::start(Some(port), Some(dir)));
                }
                _ => return Ok(false),
            }
            Ok(true)
        })
    }
}

/// Every promise of the backend trait, the fault checks included (`stopped`, `frozen`,
/// `restart`), on a redis-server of the test's own.
#[test]
fn fault_the_redis_backend_keeps_the_kit_promises_when_stopped_frozen_and_restarted() {
    let server = OwnRedis::start(None, None);
    let (kit, _) = kit(server.url());
    kit.faults(RedisFaults {
        servers: Mutex::new(vec![server]),
    })
    .run();
}
