//! The checks that break the store on purpose ([`Fault`]): stopped, frozen, restarted. Each
//! answers "not run" when the kit was given no way to inject its fault.

use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use bucket4rs_distributed::Backend;

use super::super::{Ctx, Fault, raw};
use super::{bucket, e, no_refill, valid_record};

pub(super) async fn stopped<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let manager = ctx
        .manager(ctx.connect().await?, "stop")
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(e)?;
    let b = bucket(&manager, "k", &no_refill(100))?;
    ensure!(b.try_consume(5).await.map_err(e)?, "a full bucket refused");
    if !ctx.inject(Fault::Stop).await? {
        return Ok("not run: the store cannot be stopped".into());
    }
    let mut failures = Vec::new();
    for _ in 0..3 {
        match b.try_consume(1).await {
            Ok(v) => failures.push(format!("a call to a stopped store answered {v}")),
            Err(err) if err.is_unavailable() => {}
            Err(err) => failures.push(format!("not an \"unavailable\" error: {err}")),
        }
    }
    ensure!(
        ctx.inject(Fault::Start).await?,
        "the store was stopped but cannot start"
    );
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    let back = Instant::now();
    let served = loop {
        match b.try_consume(1).await {
            Ok(v) => break v,
            Err(err) => ensure!(
                back.elapsed() < Duration::from_secs(15),
                "no call succeeded within 15 s of the start: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(served, "the bucket refused a token after the start");
    let left = b.available_tokens().await.map_err(e)?;
    ensure!(
        left == 94,
        "{left} tokens left, 94 expected: the calls to the stopped store charged"
    );
    manager.remove("k").await.map_err(e)?;
    Ok(format!(
        "3 calls failed \"unavailable\" while stopped, nothing charged; served again {:?} after \
         the start",
        back.elapsed()
    ))
}

pub(super) async fn frozen<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let backend = ctx.connect().await?;
    let patient = ctx
        .manager(Arc::clone(&backend), "freeze")
        .build()
        .map_err(e)?;
    valid_record(&patient, "k").await?;
    let hasty = ctx
        .manager(ctx.connect().await?, "freeze")
        .timeout(Duration::from_millis(300))
        .build()
        .map_err(e)?;
    let b = bucket(&hasty, "k", &no_refill(10))?;
    if !ctx.inject(Fault::Freeze).await? {
        return Ok("not run: the store cannot be frozen".into());
    }
    let mut answered = Vec::new();
    for _ in 0..4 {
        if let Ok(v) = b.try_consume(1).await {
            answered.push(v);
        }
    }
    ensure!(
        ctx.inject(Fault::Thaw).await?,
        "the store was frozen but cannot thaw"
    );
    ensure!(
        answered.is_empty(),
        "a frozen store answered {} calls",
        answered.len()
    );
    // Whatever sat in the store's queue ran after its caller's deadline: it must not take a
    // token. (The record's bytes may change: the hasty manager settles its calls in doubt,
    // leaving tombstones in the record's ledger.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let storage = patient.storage_key("k").map_err(e)?;
    ensure!(
        raw(&*backend, &storage).await?.is_some(),
        "the record is gone after the thaw"
    );
    let left = bucket(&patient, "k", &no_refill(10))?
        .available_tokens()
        .await
        .map_err(e)?;
    ensure!(
        left == 9,
        "calls that timed out against a frozen store charged tokens once it thawed ({left} of \
         9 left)"
    );
    ensure!(
        bucket(&patient, "k", &no_refill(10))?
            .try_consume(1)
            .await
            .map_err(e)?,
        "the bucket refused a token after the thaw"
    );
    patient.remove("k").await.map_err(e)?;
    Ok(
        "4 calls timed out (300 ms) against a frozen store and charged nothing after it thawed"
            .into(),
    )
}

pub(super) async fn restart<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let manager = ctx
        .manager(ctx.connect().await?, "restart")
        .build()
        .map_err(e)?;
    let config = no_refill(100);
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        ensure!(
            bucket(&manager, k, &config)?
                .try_consume(i as u64 + 7)
                .await
                .map_err(e)?,
            "a full bucket refused"
        );
    }
    if !ctx.inject(Fault::Restart).await? {
        return Ok("not run: the store cannot be restarted".into());
    }
    // The client from before the restart: its first call succeeds.
    let first = bucket(&manager, "a", &config)?.available_tokens().await;
    ensure!(
        first.as_ref().is_ok_and(|&t| t == 93),
        "the first call after the restart answered {first:?}, not 93 tokens"
    );
    // A client made after it finds every bucket as it was.
    let fresh = ctx
        .manager(ctx.connect().await?, "restart")
        .build()
        .map_err(e)?;
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        let left = bucket(&fresh, k, &config)?
            .available_tokens()
            .await
            .map_err(e)?;
        ensure!(
            left == 100 - (i as i64 + 7),
            "bucket {k} holds {left} tokens after the restart"
        );
        fresh.remove(k).await.map_err(e)?;
    }
    Ok(
        "the first call after a restart succeeded; 3 buckets as they were, old and new clients"
            .into(),
    )
}
