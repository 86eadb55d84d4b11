//! The faults of the local cluster's real nodes, on real pods: a partitioned
//! node turns NotReady in the API while its containers keep running, its pods
//! are unreachable from the other nodes and from this host, and after `heal`
//! it is Ready again with its pods reachable; a powered-off node's pods stop
//! at once, nothing is cleaned up in the API, and after `poweron` they run
//! again with their volume's data intact.
//!
//! One test, so that the two faults never overlap (each test binary runs on
//! its own; tests within one run in parallel).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use testkit::control_plane::ControlPlane;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, http_get, kubectl, wait_for};

/// The node the faults hit, and the one a client watches it from.
const FAULTY: &str = "keelson-node-3";
const WATCHER: &str = "keelson-node-1";
/// Upstream's node-monitor-grace-period (50 s) and the node controller's
/// 5 s monitor period, with room: how long a silent node takes to be NotReady.
const NOT_READY_TIMEOUT: Duration = Duration::from_secs(150);
const UNREACHABLE: Duration = Duration::from_secs(3);

/// A pod on `node` that serves `served-by-<node>` and writes a heartbeat to
/// /tmp/beat five times a second; `volume` mounts the claim `data` at /data.
fn beating_server(name: &str, node: &str, volume: bool) -> anyhow::Result<Pod> {
    let script = "(while :; do date +%s%N > /tmp/beat; sleep 0.2; done) & \
                  echo served-by-$NODE > /usr/share/nginx/html/index.html && exec nginx -g 'daemon off;'";
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "nginx", "image": "nginx:1.25-alpine", "command": ["bash", "-c", script],
                "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}}],
        }
    });
    if volume {
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
        pod["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
    }
    Ok(serde_json::from_value(pod)?)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn container_id(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()?.container_id.clone()
}

async fn start(ns: &TestNamespace, pod: Pod) -> anyhow::Result<Pod> {
    let name = pod.metadata.name.clone().context("unnamed pod")?;
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await?;
    wait_for(&pods, &name, "the pod to be Ready", DEFAULT_TIMEOUT, is_ready).await
}

fn pod_ip(pod: &Pod) -> anyhow::Result<String> {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("a pod without an IP")
}

/// The host pids of the pod's processes (a real node's containers are this
/// machine's processes; their cgroup path names the pod).
fn pod_processes(pod: &Pod) -> Vec<u32> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&format!("pod{uid}")))
        })
        .collect()
}

/// Whether `pid` is a live process: a killed one may stay a zombie until
/// this machine's init reaps it.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])))
}

/// The pod's heartbeat, read from the host through one of its processes.
fn heartbeat(pid: u32) -> Option<u128> {
    std::fs::read_to_string(format!("/proc/{pid}/root/tmp/beat")).ok()?.trim().parse().ok()
}

/// What `client` gets for `GET /` from `address` (5 s at most), through kubectl exec.
fn fetch_in_pod(ns: &TestNamespace, client: &str, address: &str) -> anyhow::Result<String> {
    let script = format!(
        "timeout 5 bash -c \"exec 3<>/dev/tcp/{address}/80; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3\" | tail -n 1"
    );
    Ok(kubectl(&["-n", &ns.name, "exec", client, "--", "bash", "-c", &script])?.trim().to_string())
}

async fn fetch_from_host(ip: &str) -> anyhow::Result<String> {
    tokio::time::timeout(UNREACHABLE, http_get(&format!("{ip}:80"))).await.context("no answer in time")?
}

async fn node_ready(nodes: &Api<Node>, name: &str, want: bool, timeout: Duration) -> anyhow::Result<()> {
    let what = if want { "Ready" } else { "NotReady" };
    wait_for(nodes, name, &format!("{name} to be {what}"), timeout, |n| {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        ready == want
    })
    .await
    .map(|_| ())
}

fn now_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

#[tokio::test]
async fn a_partitioned_node_then_a_powered_off_node() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let plane = ControlPlane::of_kubeconfig().context("node faults need the cluster `make cluster-up` starts")?;
    let ns = cluster.real_namespace("node-faults").await?;
    let nodes = Api::<Node>::all(cluster.client.clone());
    let mut client = testkit::pods::shell_pod("watcher", "nginx:1.25-alpine", "exec sleep infinity");
    client["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": WATCHER});
    client["spec"]["restartPolicy"] = json!("Always");
    start(&ns, serde_json::from_value(client)?).await?;

    // Partition.
    let isolated = start(&ns, beating_server("isolated", FAULTY, false)?).await?;
    let ip = pod_ip(&isolated)?;
    let served = format!("served-by-{FAULTY}");
    ensure!(fetch_in_pod(&ns, "watcher", &ip)? == served, "the other node cannot reach the pod before the fault");
    // A process of the server's container (not of the pod's sandbox): it sees /tmp/beat, once its
    // loop has written it (a moment after the container started).
    eventually(Duration::from_secs(30), "a process of the pod's container with its heartbeat", || async {
        pod_processes(&isolated).into_iter().any(|pid| heartbeat(pid).is_some())
    })
    .await?;
    let pid = pod_processes(&isolated)
        .into_iter()
        .find(|pid| heartbeat(*pid).is_some())
        .context("no process of the pod's container on this machine")?;

    plane.partition(FAULTY)?;
    let healed = async {
        node_ready(&nodes, FAULTY, false, NOT_READY_TIMEOUT).await?;
        let unreachable = fetch_in_pod(&ns, "watcher", &ip);
        ensure!(
            !unreachable.as_ref().is_ok_and(|body| body.contains(&served)),
            "the partitioned node's pod answered a pod on {WATCHER}: {unreachable:?}"
        );
        ensure!(fetch_from_host(&ip).await.is_err(), "the partitioned node's pod answered this host");
        // Its containers run on: the heartbeat moves.
        let before = heartbeat(pid).context("no heartbeat while partitioned")?;
        eventually(Duration::from_secs(10), "the partitioned pod's heartbeat to move", || async {
            heartbeat(pid).is_some_and(|beat| beat > before)
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    plane.heal(FAULTY)?;
    healed?;
    node_ready(&nodes, FAULTY, true, DEFAULT_TIMEOUT).await?;
    eventually(DEFAULT_TIMEOUT, "the healed node's pod to answer the other node and this host", || async {
        fetch_in_pod(&ns, "watcher", &ip).is_ok_and(|body| body == served)
            && fetch_from_host(&ip).await.is_ok_and(|body| body.contains(&served))
    })
    .await?;
    ensure!(pod_processes(&isolated).contains(&pid), "the pod's process did not survive the partition");

    // Power-off.
    let claim = json!({"metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    ns.api::<PersistentVolumeClaim>().create(&PostParams::default(), &serde_json::from_value(claim)?).await?;
    let keeper = start(&ns, beating_server("keeper", FAULTY, true)?).await?;
    let token = format!("kept-{}", now_nanos());
    kubectl(&["-n", &ns.name, "exec", "keeper", "--", "bash", "-c", &format!("echo {token} > /data/marker && sync")])?;
    let processes = pod_processes(&keeper);
    ensure!(!processes.is_empty(), "no process of the pod on this machine");
    let keeper_ip = pod_ip(&keeper)?;

    plane.power_off(FAULTY)?;
    let powered_off = async {
        let alive: Vec<u32> = processes.iter().copied().filter(|pid| running(*pid)).collect();
        ensure!(alive.is_empty(), "processes of the pod outlived the power-off: {alive:?}");
        ensure!(fetch_from_host(&keeper_ip).await.is_err(), "the powered-off node's pod answered");
        // Nothing was cleaned up in the API: the pod is still Running there.
        let seen = ns.api::<Pod>().get("keeper").await?;
        let phase = seen.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        ensure!(phase == "Running", "the API was told of the power-off: phase {phase}");
        node_ready(&nodes, FAULTY, false, NOT_READY_TIMEOUT).await
    }
    .await;
    plane.power_on(FAULTY)?;
    powered_off?;
    node_ready(&nodes, FAULTY, true, DEFAULT_TIMEOUT).await?;
    let old_container = container_id(&keeper);
    let back = wait_for(&ns.api::<Pod>(), "keeper", "the pod to run again after power-on", DEFAULT_TIMEOUT, |p| {
        is_ready(p) && container_id(p).is_some() && container_id(p) != old_container
    })
    .await?;
    let kept = kubectl(&["-n", &ns.name, "exec", "keeper", "--", "cat", "/data/marker"])?;
    ensure!(kept.trim() == token, "the volume's data did not survive the power-off: {kept:?}, wrote {token}");
    let back_ip = pod_ip(&back)?;
    eventually(DEFAULT_TIMEOUT, "the pod to serve again on its node", || async {
        fetch_from_host(&back_ip).await.is_ok_and(|body| body.contains(&served))
    })
    .await?;
    Ok(())
}
