//! Integration tests of bucket4rs-distributed (one binary; Redis modules need `--features redis`
//! and a Redis at `BUCKET4RS_REDIS_URL`, default `redis://127.0.0.1:6379`).

mod batching;
mod breaker;
#[cfg(feature = "redis")]
mod breaker_redis;
#[cfg(feature = "redis")]
#[allow(dead_code)] // shared with the `postgres` binary, which uses more of it
mod certs;
// The service helpers shared with the `postgres` binary are used here by the Redis tests only.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
mod common;
mod custom_backend;
mod embedded;
mod errors;
#[cfg(feature = "redis")]
mod failover;
mod golden;
mod leasing;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_boundary;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_faults;
#[cfg(feature = "redis")]
mod redis_kit;
#[cfg(feature = "redis")]
mod redis_leasing;
#[cfg(feature = "redis")]
mod redis_sentinel;
#[cfg(feature = "redis")]
mod redis_tls;
mod waits;
