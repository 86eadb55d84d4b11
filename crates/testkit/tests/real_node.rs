//! The local cluster's three real nodes run real containers: the stand-in
//! images, volumes that non-root pods can write, pods that reach each other
//! across nodes by IP, Service and DNS, NodePorts on loopback, cluster DNS,
//! logs, exec and port-forward, and a fence that keeps pods on their bridge.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::pods::{run, shell_pod};
use testkit::{
    DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, http_get, kubectl, wait_for, wait_for_deletion,
};

const NODES: [&str; 3] = ["keelson-node-1", "keelson-node-2", "keelson-node-3"];

#[tokio::test]
async fn three_real_nodes_are_ready_in_zones_of_their_own_and_name_their_stand_in_images() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let (mut hostnames, mut zones, mut addresses) = (Vec::new(), Vec::new(), Vec::new());
    for name in NODES {
        let node = Api::<Node>::all(cluster.client.clone()).get(name).await.context("a real node is registered")?;
        let status = node.status.clone().unwrap_or_default();
        let ready = status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
        ensure!(ready, "{name} is not Ready");
        let internal = status.addresses.unwrap_or_default().into_iter().find(|a| a.type_ == "InternalIP");
        let address = internal.map(|a| a.address).unwrap_or_default();
        ensure!(address.starts_with("10.88."), "{name} has no InternalIP on the nodes' bridge: {address:?}");
        let labels = node.metadata.labels.clone().unwrap_or_default();
        hostnames.push(labels.get("kubernetes.io/hostname").cloned().unwrap_or_default());
        zones.push(labels.get("topology.kubernetes.io/zone").cloned().unwrap_or_default());
        addresses.push(address);
        let stand_ins =
            node.metadata.annotations.unwrap_or_default().remove("keelson.dev/stand-in-images").unwrap_or_default();
        ensure!(
            stand_ins.contains("postgresql-15") && stand_ins.contains("nginx"),
            "{name}: stand-ins not named: {stand_ins:?}"
        );
    }
    ensure!(hostnames == NODES, "hostname labels are not the nodes' names: {hostnames:?}");
    for distinct in [&zones, &addresses] {
        let mut unique = distinct.clone();
        unique.sort();
        unique.dedup();
        ensure!(unique.len() == NODES.len() && !unique.contains(&String::new()), "not one per node: {distinct:?}");
    }
    Ok(())
}

/// A pod on `node` serving `served-by-<node>` on port 80 (nginx stand-in).
fn server_pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "nginx", "image": "nginx:1.25-alpine",
                "command": ["bash", "-c", "echo served-by-$NODE > /usr/share/nginx/html/index.html && exec nginx -g 'daemon off;'"],
                "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "ports": [{"containerPort": 80}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}}],
        }
    })
}

#[tokio::test]
async fn pods_on_different_nodes_reach_each_other_by_ip_service_and_dns() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-cross-node").await?;
    let pods = ns.api::<Pod>();
    for (i, node) in NODES.iter().enumerate() {
        let name = format!("web-{}", i + 1);
        pods.create(&PostParams::default(), &serde_json::from_value(server_pod(&name, node))?).await?;
        let service = json!({"metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 80}]}});
        ns.api::<Service>().create(&PostParams::default(), &serde_json::from_value(service)?).await?;
    }
    let mut ips = Vec::new();
    for i in 1..=NODES.len() {
        let ready = wait_for(&pods, &format!("web-{i}"), "the server to be Ready", DEFAULT_TIMEOUT, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .await?;
        ips.push(ready.status.and_then(|s| s.pod_ip).context("a Ready pod without an IP")?);
    }
    // Every node's client fetches every server by pod IP and by Service DNS name.
    // A node's kube-proxy programs a new Service a moment after its endpoint is
    // Ready, so each fetch is retried for up to 30 s before it counts as failed.
    let mut script = String::from(
        "get() { for _ in $(seq 1 30); do \
           out=$(timeout 3 bash -c \"exec 3<>/dev/tcp/$1/80; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3\" | tail -n 1); \
           case \"$out\" in served-by-*) echo \"$out\"; return;; esac; sleep 1; done; echo \"unreachable: $out\"; }; ",
    );
    for (i, ip) in ips.iter().enumerate() {
        let dns = format!("web-{}.{}.svc.cluster.local", i + 1, ns.name);
        script += &format!("echo \"ip {} $(get {ip})\"; echo \"dns {} $(get {dns})\"; ", i + 1, i + 1);
    }
    for (k, node) in NODES.iter().enumerate() {
        let mut client = shell_pod(&format!("client-{}", k + 1), "nginx:1.25-alpine", &script);
        client["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        let finished = run(&ns, client).await?;
        for (i, server) in NODES.iter().enumerate() {
            for how in ["ip", "dns"] {
                let line = format!("{how} {} served-by-{server}", i + 1);
                ensure!(finished.logs.contains(&line), "from {node}: no `{line}` in:\n{}", finished.logs);
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn volume_written_by_uid_999_outlives_its_pod_and_grows() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-volume").await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    let claim = json!({"metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    claims.create(&PostParams::default(), &serde_json::from_value(claim)?).await?;
    let as_postgres = |name: &str, script: &str| {
        let mut pod = shell_pod(name, "postgres:15.2", script);
        pod["spec"]["securityContext"] =
            json!({"runAsUser": 999, "runAsGroup": 999, "fsGroup": 999, "runAsNonRoot": true});
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
        pod["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
        pod
    };
    let written =
        run(&ns, as_postgres("writer", "id -u; initdb -D /data/pg >/dev/null && echo kept > /data/pg/marker")).await?;
    ensure!(written.succeeded && written.logs.starts_with("999"), "uid 999 could not write: {}", written.logs);
    let read = run(&ns, as_postgres("reader", "cat /data/pg/marker; postgres --version")).await?;
    ensure!(read.succeeded && read.logs.starts_with("kept"), "the data did not outlive its pod: {}", read.logs);
    ensure!(read.logs.contains("PostgreSQL) 15."), "not PostgreSQL 15: {}", read.logs);

    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await?;
    let grown = wait_for(&claims, "data", "the claim to grow to 2Gi", DEFAULT_TIMEOUT, |c| {
        c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).is_some_and(|q| q.0 == "2Gi")
    })
    .await?;
    let volume = grown.spec.and_then(|s| s.volume_name).context("bound claim without a volume")?;

    let pods = ns.api::<Pod>();
    for name in ["writer", "reader"] {
        pods.delete(name, &DeleteParams::default()).await?;
        wait_for_deletion(&pods, name, "the pod to go", DEFAULT_TIMEOUT).await?;
    }
    claims.delete("data", &DeleteParams::default()).await?;
    let volumes = Api::<PersistentVolume>::all(cluster.client.clone());
    wait_for_deletion(&volumes, &volume, "the released volume to be deleted", DEFAULT_TIMEOUT).await?;
    Ok(())
}

#[tokio::test]
async fn nginx_stand_in_serves_on_a_loopback_nodeport_with_logs_exec_and_port_forward() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-web").await?;
    let deployment = json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25-alpine", "ports": [{"containerPort": 80}]}]}}}});
    let deployments = ns.api::<Deployment>();
    deployments.create(&PostParams::default(), &serde_json::from_value(deployment)?).await?;
    let service = json!({"metadata": {"name": "web"},
        "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 80}]}});
    let service: Service =
        ns.api::<Service>().create(&PostParams::default(), &serde_json::from_value(service)?).await?;
    let node_port = service.spec.and_then(|s| s.ports).and_then(|p| p.first()?.node_port).context("no nodePort")?;
    wait_for(&deployments, "web", "2 available real replicas", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().and_then(|s| s.available_replicas) == Some(2)
    })
    .await?;

    let address = format!("127.0.0.1:{node_port}");
    eventually(DEFAULT_TIMEOUT, "the NodePort to answer on loopback with the welcome page", || async {
        http_get(&address)
            .await
            .is_ok_and(|body| body.starts_with("HTTP/1.1 200") && body.contains("Welcome to nginx!"))
    })
    .await?;

    let logs = kubectl(&["-n", &ns.name, "logs", "deploy/web", "--all-containers", "--prefix"])?;
    let exec = kubectl(&["-n", &ns.name, "exec", "deploy/web", "--", "cat", "/usr/share/nginx/html/index.html"])?;
    ensure!(exec.contains("Keelson stand-in"), "exec did not reach the container: {exec}");
    let forwarded = port_forward(&ns, "deploy/web").await?;
    ensure!(forwarded.contains("Welcome to nginx!"), "port-forward answered: {forwarded}");
    // The requests above were logged by one of the two pods; kubectl shows one.
    let all_logs = format!("{logs}{}", kubectl(&["-n", &ns.name, "logs", "-l", "app=web", "--prefix"])?);
    ensure!(all_logs.contains("\"GET / HTTP/1.0\""), "no access log line in: {all_logs}");
    Ok(())
}

/// `kubectl port-forward` on a free local port, one GET through it.
async fn port_forward(ns: &TestNamespace, target: &str) -> anyhow::Result<String> {
    let program = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let mut child = KillOnDrop(
        Command::new(program)
            .args(["-n", &ns.name, "port-forward", "--address", "127.0.0.1", target, ":80"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().context("no stdout")?;
    // The reader stays open: kubectl writes a line per connection and dies of SIGPIPE without it.
    let first = tokio::task::spawn_blocking(move || {
        let (mut reader, mut line) = (BufReader::new(stdout), String::new());
        reader.read_line(&mut line).map(|_| (line, reader))
    });
    let (line, _reader) =
        tokio::time::timeout(Duration::from_secs(60), first).await.context("port-forward did not start")???;
    // "Forwarding from 127.0.0.1:43121 -> 80"
    let port =
        line.split(" -> ").next().and_then(|l| l.rsplit(':').next()).context("unexpected port-forward output")?;
    http_get(&format!("127.0.0.1:{}", port.trim())).await
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn cluster_dns_resolves_cluster_names_and_nothing_else() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-dns").await?;
    let script = "getent hosts kubernetes.default.svc.cluster.local && getent hosts kubernetes.default \
                  && if getent hosts example.com; then echo LEAKED; else echo NO-UPSTREAM; fi";
    let finished = run(&ns, shell_pod("dns", "nginx:1.25-alpine", script)).await?;
    ensure!(finished.succeeded, "cluster names did not resolve: {}", finished.logs);
    ensure!(finished.logs.contains("10.96.0.1"), "kubernetes.default did not resolve: {}", finished.logs);
    ensure!(
        finished.logs.trim_end().ends_with("NO-UPSTREAM"),
        "a name outside the cluster resolved: {}",
        finished.logs
    );
    Ok(())
}

#[tokio::test]
async fn missing_image_fails_fast_without_leaving_the_machine() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-missing-image").await?;
    let pod: Pod = serde_json::from_value(shell_pod("missing", "nginx:0.0-not-built-here", "true"))?;
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await?;
    let failed = wait_for(&pods, "missing", "the pull to fail", DEFAULT_TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|statuses| {
            statuses.iter().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
            })
        })
    })
    .await?;
    let message = serde_json::to_string(&failed.status)?;
    ensure!(message.contains("127.0.0.1:9"), "the pull went somewhere other than the closed loopback port: {message}");
    Ok(())
}

/// A test host of ours: a network namespace outside the bridge, with an HTTP
/// server, routed from this host through a veth pair.
struct TestHost {
    netns: String,
    address: String,
    server: Option<KillOnDrop>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("ip").args(args).status().context("cannot run ip")?;
    if !status.success() {
        bail!("ip {} failed", args.join(" "));
    }
    Ok(())
}

impl TestHost {
    fn create() -> anyhow::Result<Self> {
        let id = std::process::id() % 250;
        let (netns, outside, inside) = (format!("keelson-test-{id}"), format!("kt{id}h"), format!("kt{id}n"));
        let mut host = TestHost { netns: netns.clone(), address: format!("10.77.{id}.2"), server: None };
        ip(&["netns", "add", &netns])?;
        ip(&["link", "add", &outside, "type", "veth", "peer", "name", &inside])?;
        ip(&["link", "set", &inside, "netns", &netns])?;
        ip(&["addr", "add", &format!("10.77.{id}.1/30"), "dev", &outside])?;
        ip(&["link", "set", &outside, "up"])?;
        ip(&["-n", &netns, "addr", "add", &format!("{}/30", host.address), "dev", &inside])?;
        ip(&["-n", &netns, "link", "set", &inside, "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        // Replies to the pods' subnet would come back through this host: only the fence stops them.
        ip(&["-n", &netns, "route", "add", "default", "via", &format!("10.77.{id}.1")])?;
        let server = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-m", "http.server", "8080", "--bind", &host.address])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the test host's server")?;
        host.server = Some(KillOnDrop(server));
        Ok(host)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        self.server.take();
        let _ = ip(&["netns", "del", &self.netns]); // takes the veth pair with it
    }
}

#[tokio::test]
async fn pods_cannot_reach_a_host_outside_the_bridge_while_this_host_can() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.real_namespace("real-fence").await?;
    let host = TestHost::create()?;
    let address = format!("{}:8080", host.address);
    eventually(DEFAULT_TIMEOUT, "this host to reach its test host", || async {
        http_get(&address).await.is_ok_and(|body| body.starts_with("HTTP/1.0 200"))
    })
    .await?;
    // The control proves the pod's network works; the probe is what the fence stops.
    let script = format!(
        "getent hosts kubernetes.default >/dev/null && echo NETWORK-UP; \
         if timeout 5 bash -c 'exec 3<>/dev/tcp/{}/8080'; then echo REACHED; else echo FENCED; fi",
        host.address
    );
    let finished = run(&ns, shell_pod("probe", "nginx:1.25-alpine", &script)).await?;
    ensure!(finished.logs.contains("NETWORK-UP"), "the pod has no network at all: {}", finished.logs);
    ensure!(finished.logs.contains("FENCED"), "a pod reached a host outside its bridge: {}", finished.logs);
    Ok(())
}
