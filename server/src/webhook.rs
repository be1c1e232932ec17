//! Durable notification by webhook: every outbox row is POSTed to the configured URL, with
//! retry and exponential backoff, until a 2xx answer (for at most a day: `WEBHOOK_RETENTION_MS`).
//!
//! Request: `POST <url>`, body = the item JSON (`{"kind":"assignment",...}` or
//! `{"kind":"event",...}`), headers `Content-Type: application/json`,
//! `Idempotency-Key: <kind>:<room>:<epoch|seq>` (the outbox dedup key: a receiver drops
//! repeats with it) and `X-Hostlease-Signature: sha256=<hex HMAC-SHA256(secret, body)>`.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::rooms::App;

/// `sha256=<hex>` of HMAC-SHA256 over `body`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes any key");
    mac.update(body);
    let out = mac.finalize().into_bytes();
    let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// Delay before attempt `attempts + 1`: 500 ms doubling, capped at 5 min, with full jitter.
pub fn backoff_ms(attempts: i64) -> u64 {
    let cap = 500u64
        .saturating_mul(1u64 << attempts.clamp(0, 20))
        .min(300_000);
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("random source");
    cap / 2 + u64::from_le_bytes(b) % (cap / 2 + 1)
}

/// How long one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Rows claimed at a time.
const BATCH: i64 = 64;
/// How long a claim keeps other processes from sending the rows it holds; a row is sent only
/// while its claim outlasts the send.
const CLAIM: Duration = Duration::from_secs(30);

pub async fn worker(app: Arc<App>) {
    let Some(url) = app.cfg.webhook_url.clone() else {
        return;
    };
    let secret = app.cfg.webhook_secret.clone().unwrap_or_default();
    // No redirects: a 301–303 turned the POST into a GET without its body, whose 2xx marked the
    // item delivered; a 307/308 sent it, signed, wherever `Location` said. A 3xx is a failure
    // (retried).
    let client = match reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "webhook client could not be built");
            return;
        }
    };
    let poll = Duration::from_millis(app.cfg.sweep_ms.clamp(5, 1000) * 2);
    // A full batch sent in time, all delivered, is followed by the next at once (a pause before
    // every batch capped delivery at 64 rows per pause); a batch cut short, or with a failure (a
    // receiver in trouble is not sent the backlog at full speed), waits.
    let mut full = false;
    loop {
        crate::rooms::pace(full, poll, &app.pauses.webhook).await;
        full = false;
        let claimed = tokio::time::Instant::now();
        let due = match app.store.webhook_due(BATCH, CLAIM.as_millis() as u64).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "webhook outbox read failed");
                continue;
            }
        };
        let mut delivered_all = due.len() as i64 == BATCH;
        for d in due {
            if claimed.elapsed() + SEND_TIMEOUT > CLAIM {
                // The claim could run out during this send, and another process send the row
                // too: the rest of the batch waits for the claim to end and is claimed again.
                delivered_all = false;
                break;
            }
            if d.attempts > 0 {
                // The same outbox key again (the receiver dedups by it).
                metrics::counter!("hostlease_webhook_redeliveries_total").increment(1);
            }
            let sig = signature(secret.as_bytes(), d.body.as_bytes());
            let res = client
                .post(&url)
                .header("content-type", "application/json")
                .header("idempotency-key", &d.key)
                .header("x-hostlease-signature", sig)
                .body(d.body.clone())
                .send()
                .await;
            let delivered = matches!(&res, Ok(r) if r.status().is_success());
            delivered_all &= delivered;
            if delivered {
                metrics::counter!("hostlease_webhook_deliveries_total", "result" => "ok")
                    .increment(1);
            } else {
                metrics::counter!("hostlease_webhook_deliveries_total", "result" => "retry")
                    .increment(1);
                tracing::warn!(
                    outbox_id = d.id,
                    attempts = d.attempts + 1,
                    "webhook delivery failed; will retry"
                );
            }
            if let Err(e) = app
                .store
                .webhook_result(&d, delivered, backoff_ms(d.attempts))
                .await
            {
                // (The row is sent again once its claim ends: no next batch at once.)
                delivered_all = false;
                tracing::warn!(error = %e, "webhook result not recorded");
            }
        }
        full = delivered_all;
    }
}
