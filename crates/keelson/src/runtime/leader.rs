//! Leader election on a `coordination.k8s.io` Lease, with client-go's
//! algorithm and controller-runtime's timings: lease 15 s, renew deadline
//! 10 s, retry every 2 s. Expiry is judged by when *we* last saw the record
//! change, not by the holder's clock, so clock skew cannot split the brain.
//! Releasing on shutdown clears the holder, so a successor takes over on its
//! next retry instead of waiting out the lease.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The holder and renew time of a Lease, as last seen.
type LeaseRecord = (Option<String>, Option<MicroTime>);

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The holder/renew-time pair last seen, and when we saw it change.
    observed: Option<(LeaseRecord, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), observed: None }
    }

    /// One attempt to take or renew the lease; true while we hold it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone());
        if self.observed.as_ref().map(|(r, _)| r) != Some(&record) {
            self.observed = Some((record, Instant::now()));
        }
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let duration = spec.lease_duration_seconds.map_or(LEASE_DURATION, |s| Duration::from_secs(s.max(0) as u64));
        let expired = self.observed.as_ref().is_none_or(|(_, seen)| seen.elapsed() > duration);
        if holder.is_some() && !ours && !expired {
            return Ok(false);
        }
        let mut next = spec.clone();
        next.renew_time = Some(now());
        next.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        if !ours {
            next.holder_identity = Some(self.identity.clone());
            next.acquire_time = Some(now());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(next);
        // The resourceVersion makes this a compare-and-swap: two contenders cannot both win.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Retries every [`RETRY_PERIOD`] until we lead.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election: cannot read or take the Lease"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews every [`RETRY_PERIOD`]; returns once a renewal has not
    /// succeeded for [`RENEW_DEADLINE`] (leadership lost).
    pub async fn hold(&mut self) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, "leader election: renewal failed"),
            }
            if last_renewed.elapsed() > RENEW_DEADLINE {
                return;
            }
        }
    }

    /// Gives the lease up if we hold it, so a successor need not wait for it to expire.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ())
    }
}
