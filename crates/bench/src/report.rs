//! The benchmark's pictures (SVG) and docs/benchmarks.md.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

pub struct Curves {
    /// Seconds at which each WebApp became Running (sorted).
    pub operator: Vec<f64>,
    /// Seconds at which each directly created Deployment became available (sorted).
    pub direct: Vec<f64>,
    pub drift_ms: Vec<f64>,
}

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 50.0;

fn frame(title: &str, x_label: &str, y_label: &str, x_max: f64, y_max: f64) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14">{title}</text>
<line x1="{PAD}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{x_label}</text>
<text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{y_label}</text>
"#,
        W / 2.0,
        H - PAD,
        W - 20.0,
        H - PAD,
        H - PAD,
        W / 2.0,
        H - 12.0,
        H / 2.0,
        H / 2.0
    );
    for i in 0..=4 {
        let fx = i as f64 / 4.0;
        let x = PAD + fx * (W - PAD - 20.0);
        let y = H - PAD - fx * (H - 2.0 * PAD);
        let _ =
            writeln!(svg, r#"<text x="{x:.0}" y="{}" text-anchor="middle">{:.1}</text>"#, H - PAD + 16.0, fx * x_max);
        let _ = writeln!(svg, r#"<text x="{}" y="{y:.0}" text-anchor="end">{:.0}</text>"#, PAD - 4.0, fx * y_max);
    }
    svg
}

fn polyline(points: &[(f64, f64)], x_max: f64, y_max: f64, color: &str) -> String {
    let scaled: Vec<String> = points
        .iter()
        .map(|(x, y)| {
            let px = PAD + (x / x_max.max(1e-9)) * (W - PAD - 20.0);
            let py = H - PAD - (y / y_max.max(1e-9)) * (H - 2.0 * PAD);
            format!("{px:.1},{py:.1}")
        })
        .collect();
    format!(r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, scaled.join(" ")) + "\n"
}

fn steps(times: &[f64]) -> Vec<(f64, f64)> {
    let mut points = vec![(0.0, 0.0)];
    for (i, t) in times.iter().enumerate() {
        points.push((*t, i as f64));
        points.push((*t, (i + 1) as f64));
    }
    points
}

pub fn convergence_svg(curves: &Curves) -> String {
    let x_max = curves.operator.last().copied().unwrap_or(1.0).max(curves.direct.last().copied().unwrap_or(1.0));
    let y_max = curves.operator.len().max(curves.direct.len()) as f64;
    let mut svg = frame("Objects ready over time", "seconds since creation", "ready", x_max, y_max);
    svg += &polyline(&steps(&curves.operator), x_max, y_max, "#1f77b4");
    svg += &polyline(&steps(&curves.direct), x_max, y_max, "#ff7f0e");
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" fill="#1f77b4">WebApps Running (Keelson)</text>"##,
        PAD + 10.0,
        PAD + 10.0
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" fill="#ff7f0e">Deployments available (direct)</text>"##,
        PAD + 10.0,
        PAD + 26.0
    );
    svg + "</svg>\n"
}

pub fn drift_svg(curves: &Curves) -> String {
    let mut sorted = curves.drift_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let x_max = sorted.last().copied().unwrap_or(1.0);
    let mut svg = frame("Drift revert latency (CDF)", "milliseconds", "% of trials", x_max, 100.0);
    let n = sorted.len().max(1) as f64;
    let points: Vec<(f64, f64)> = sorted.iter().enumerate().map(|(i, ms)| (*ms, (i + 1) as f64 * 100.0 / n)).collect();
    svg += &polyline(&points, x_max, 100.0, "#2ca02c");
    svg + "</svg>\n"
}

const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// Named lines of (x, y) points, each with its marks, on one frame from zero.
pub fn lines_svg(title: &str, x_label: &str, y_label: &str, lines: &[(&str, Vec<(f64, f64)>)]) -> String {
    let all = lines.iter().flat_map(|(_, points)| points.iter());
    let (x_max, y_max) = all.fold((1e-9f64, 1e-9f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let (x_max, y_max) = (x_max, y_max * 1.1);
    let mut svg = frame(title, x_label, y_label, x_max, y_max);
    for (i, (name, points)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        svg += &polyline(points, x_max, y_max, color);
        for (x, y) in points {
            let px = PAD + (x / x_max) * (W - PAD - 20.0);
            let py = H - PAD - (y / y_max) * (H - 2.0 * PAD);
            let _ = writeln!(svg, r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{color}"/>"#);
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" fill="{color}">{name}</text>"#,
            PAD + 10.0,
            PAD + 10.0 + 16.0 * i as f64
        );
    }
    svg + "</svg>\n"
}

pub fn write_pictures(dir: &Path, curves: &Curves) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("convergence.svg"), convergence_svg(curves))?;
    std::fs::write(dir.join("drift.svg"), drift_svg(curves))?;
    Ok(())
}

pub fn markdown(results: &Value) -> String {
    let w = &results["webapp"];
    let d = &results["mydatabase"];
    let m = &results["machine"];
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let ratio = w["ratio"].as_f64().unwrap_or(f64::MAX);
    let p99 = w["drift_ms"]["p99"].as_f64().unwrap_or(f64::MAX);
    let idle = w["idle_writes"].as_u64().unwrap_or(u64::MAX);
    let rss = w["rss_peak_mb"].as_f64().unwrap_or(f64::MAX);
    let per_app = w["convergence_writes_per_webapp"].as_f64().unwrap_or(f64::MAX);
    let r = &results["restart"];
    let restart_ready = r["ready_s"].as_f64().unwrap_or(f64::MAX);
    let restart_writes = r["writes"].as_u64().unwrap_or(u64::MAX);
    let by_kind = w["convergence_writes_by_kind"]
        .as_object()
        .map(|kinds| kinds.iter().map(|(kind, n)| format!("{kind} {n}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let compared = &w["revert_writes_compared"];
    let compared_row = if compared.is_object() {
        format!(
            "| a revert's write, two ways side by side ({n} each, client-side): whole-object apply · one-field merge patch, same manager (p50 / p99) | {a50} / {a99} ms · {m50} / {m99} ms | | |\n",
            n = compared["trials_each"],
            a50 = compared["apply_ms"]["p50"],
            a99 = compared["apply_ms"]["p99"],
            m50 = compared["merge_patch_ms"]["p50"],
            m99 = compared["merge_patch_ms"]["p99"],
        )
    } else {
        String::new()
    };
    let managers_after_merge = compared["managers_after_merge_patch"]
        .as_array()
        .map(|entries| {
            entries.iter().filter_map(Value::as_str).map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ")
        })
        .unwrap_or_else(|| "not measured in this run".into());
    let cpu = &w["cpu_by_process"];
    let n = w["n"].as_f64().unwrap_or_default();
    let (cpu_row, cpu_text) = cpu_account(n, &cpu["direct"], &cpu["operator"]);
    let cluster_text = unfinished_work(n, &w["cluster_writes_while_converging"]);
    format!(
        "# Benchmarks\n\n\
         Generated by `make bench` (`crates/bench`), from `target/bench/results.json` of one run.\n\n\
         - Machine: {cpu}, {cores} cores, {mem} GiB\n\
         - Kubernetes {k8s} (local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)\n\
         - Operator: `{cmd}`, release build, acting as its ServiceAccount with the generated ClusterRole\n\n\
         ## Results\n\n\
         | measure | value | goal | |\n|---|---|---|---|\n\
         | WebApps created at once (replicas 1) | {n} | | |\n\
         | all Running (Keelson) | {conv} s | | |\n\
         | all Deployments and Services exist | {children} s | | |\n\
         | same Deployments + Services created directly, all available | {direct} s | | |\n\
         | ratio operator / direct | {ratio} | ≤ 1.10 | {v_ratio} |\n\
         | writes per WebApp during convergence (API-server audit log) | {per_app} ({writes}: {by_kind}) | ≤ 3 | {v_writes} |\n\
         | drift revert p50 / p90 / p99 / max ({trials} trials) | {p50} / {p90} / {p99} / {max} ms | p99 ≤ 20 ms | {v_drift} |\n\
         | revert in the API server's audit log ({reverts} trials): reaction p50 / p99 (outsider's write done → Keelson's arrives) | {re50} / {re99} ms | p50 ≤ 3, p99 ≤ 10 ms | {v_reaction} |\n\
         | revert in the audit log: Keelson's write itself, p50 / p99 (arrival → done) | {rw50} / {rw99} ms | | |\n\
         | revert in the audit log, whole span: the outsider's write arrives → Keelson's done, p50 / p99 / max (the drift less the harness's own request and watch) | {span} | | |\n\
         | revert in the audit log: the outsider's write before it, p50 / p99 (arrival → done) | {ow50} / {ow99} ms | | |\n\
         | inside the operator (`keelson_drift_revert_delay_seconds`): the drifted copy's arrival → the revert sent, mean / p50 / p99 (p50, p99: at most, by bucket) | {in_op} | | |\n\
         {compared_row}\
         | writes during {idle_s} s at rest (API-server audit log) | {idle} | 0 | {v_idle} |\n\
         | operator peak RSS during convergence | {rss_peak} MB | ≤ 25 MB | {v_rss} |\n\
         | operator RSS at rest with {n} WebApps (anonymous + file-backed) | {rss_rest} MB ({rss_anon} + {rss_file}) | | |\n\
         | operator CPU during convergence | {cpu_s} s | | |\n\
         {cpu_row}\
         | restart over the {n} converged WebApps: ready after | {r_ready} s | ≤ 5 s | {v_r_ready} |\n\
         | restart: writes until idle (idle after {r_idle} s) | {r_writes} | 0 | {v_r_writes} |\n\
         | restart: peak RSS of the new process | {r_rss} MB | | |\n\
         | MyDatabases (replicas 1) created at once → all Running | {dn} → {dconv} s | | |\n\
         | operator RSS with the databases too | {drss} MB | | |\n\n\
         ![WebApps Running over time, operator vs direct](bench/convergence.svg)\n\n\
         ![Drift revert latency](bench/drift.svg)\n\n\
         ## How it is measured\n\n\
         - **Lower bound**: the harness creates the same Deployments and Services (built by the same\n\
           builder functions) itself, 32 requests in flight, and waits until every Deployment is\n\
           available. Then the namespace is deleted and the operator run starts on a quiet cluster.\n\
         - **Convergence**: N WebApps created with 32 requests in flight; a watch records when each\n\
           reports `phase: Running` with `availableReplicas == replicas`.\n\
         - **Drift**: a watch on the Deployments runs throughout; each trial patches a random\n\
           Deployment to 10 replicas and measures from just before the patch is sent until the watch\n\
           delivers `spec.replicas: 1` again. This includes the harness's own watch delivery. A trial\n\
           starts once the API server has written nothing for {quiet_ms} ms (its audit log, writes only,\n\
           has not grown): a drift meets a cluster at rest, not the previous trial's pod churn, whose\n\
           Events and endpoint and status updates trail the revert by up to a second ({started_quiet} of\n\
           {trials} trials found it quiet within 10 s).\n\
         - **Convergence writes**: the create/update/patch/delete requests the API server's audit\n\
           log shows for the operator's ServiceAccount from the first WebApp's creation until the\n\
           operator is idle, by verb and resource.\n\
         - **Idle writes**: once no reconcile has started for 5 s, the harness counts, in the API\n\
           server's audit log, the create/update/patch/delete requests completed for the operator's\n\
           ServiceAccount during the window; the operator's own metrics are not trusted for this.\n\
         - **Restart**: after the drift trials the operator is stopped (SIGTERM) and started again;\n\
           ready is its `/readyz` answering 200 (every watch listed), and its writes are counted in the\n\
           audit log from its start until no reconcile has started for 5 s.\n\
         - **A revert's write, two ways**: on ten Deployments of their own (no owner, no\n\
           managed-by label: the operator ignores them), while the operator runs over the converged\n\
           WebApps, the harness scales one to 10 as an outsider and writes it back at once, in turn\n\
           as a server-side apply of the whole desired object (forced, manager `keelson`) and as\n\
           Keelson does, a one-field JSON merge patch under the same manager; each timed from\n\
           the client, the Deployment settled and the API server quiet before the next.\n\
         - **Cost**: RSS sampled from `/proc/<pid>/status` every 50 ms; CPU from `/proc/<pid>/stat`.\n\n\
         ## What bounds the rest\n\n\
         {cpu_text}{cluster_text}\
         - Of the writes, Service creation is the slowest: every WebApp's Service is a NodePort,\n\
           and allocating its ports and ClusterIP serialises the creations (in a run at N=1000 the\n\
           operator's Service applies came at about 14 per second with 16 reconciles at once, and\n\
           still at 14 with 64, p50 4.4 s each: the operator's parallelism is not the limit).\n\
         - Status: a WebApp's progress is written only after it has been on its way for 5 s as the\n\
           operator saw it (not since its creation: a WebApp that waited in the queue and then\n\
           converged at once wrote `Scaling` and `Running` 0.1 s apart), at most every 5 s, and not\n\
           while more than 10 objects are on their way at once: a mass creation costs about one\n\
           status write per WebApp. While the cache lags the operator's last status write, a\n\
           status that differs from it only in its conditions' transition times is not written\n\
           (a reconcile reading the lagging copy builds them anew, a second later): that saved\n\
           10-12 writes at N=1000. Any other difference is written at once, since it may carry\n\
           what was seen only once (a failover's end).\n\
         - A revert's write: the one-field merge patch is the cheaper request (see the results),\n\
           and Keelson sends it when a replica count alone drifted (`kubectl scale`). It is recorded\n\
           as a second managedFields entry of `keelson`, an `Update` beside its `Apply` (after a\n\
           merge-patch revert this run found {managers_after_merge}): that entry could only keep a\n\
           field a later spec stops setting, and every builder sets `spec.replicas` on every apply.\n\
           Any other drift goes back by apply, or by a merge patch of the whole desired object where\n\
           apply cannot take it back (an edit inside a list entry, such as a Service port).\n\
         - Where a revert's time goes (the rows above, p50): the outsider's own write, the\n\
           reaction (the watch event's way to the operator, the operator, its request's way back),\n\
           Keelson's write, and the harness's watch delivery. The two writes are the API server's,\n\
           on a 2-core machine shared with the whole control plane while the Deployment controller\n\
           works on the same scale-up. Of the reaction,\n\
           the part inside the operator is measured by its own histogram (mean {in_op_mean} ms in\n\
           this run). Keelson runs its own reconcile queue (`runtime/queue.rs`) instead of\n\
           kube-runtime's `Controller`, whose scheduler sends every trigger, even one due at once,\n\
           through a `tokio_util` `DelayQueue` that rounds its deadline up to the next millisecond and\n\
           waits for tokio's timer: that alone took p50 2.1 ms on this machine (mean 2.41 ms inside\n\
           the operator at N=1000 before the change), where a trigger now goes straight to the ready\n\
           list, so the reaction's tail is the API server's: its watch dispatch and the request's\n\
           way in. A child whose cached copy shows Keelson's last write is written back\n\
           without reading it first, and a new WebApp's children are created without one (the\n\
           cache holds every child with Keelson's labels): 2000 GETs fewer at N=1000.\n\
         - Memory (issue 15): each controller caches only its own children (the MyDatabase\n\
           controller used to cache every WebApp's Service), initial lists streamed where the API\n\
           server supports it (a restart over 1000 WebApps peaked at 48-50 MB, now 33 MB), jemalloc\n\
           with two arenas and pages handed back within a second, and an LTO build optimised for\n\
           size (binary 25.7 MB → 15.7 MB with LTO → {binary_mb} MB with `opt-level = \"s\"`). A heap\n\
           profile at N=1000 (heaptrack) peaked at 18.3 MB of heap, most of it the watch caches.\n\
           Children are now cached packed (`runtime/packed.rs`): what the watch and the controller\n\
           read (name, namespace, owner references, version; labels only for the kinds read by\n\
           label) as a struct, the rest as compact JSON decoded when a reconcile reads it. A\n\
           k8s-openapi Deployment is 2448 bytes inline plus 2144 per container before its strings;\n\
           its JSON is about 850 bytes. At N=1000 the anonymous RSS at rest went 20.9 → 12.5 MB\n\
           and the peak 32.2 → 24.1-24.4 MB (100 MyDatabases beside them: 53.8 → 35.1-35.5 MB), for about\n\
           0.4 s more CPU during convergence. The rest of the RSS is the binary's file-backed pages.\n\
         - Status writes per WebApp at N=1000: 2.2 (session 5) → 1.69 → 1.135 (a budget of 2\n\
           progress writes per second) → 1.0.\n\
         - Steps so far (issue 15; `make bench-quick`, N=100, unless said): no Event per routine\n\
           child creation (N=1000: 6.26 → 4.2 writes per WebApp with the status hold below; the\n\
           Events were 2180 of 6261 writes), the status hold (2.39 → 1.51 status writes per WebApp\n\
           at N=100, 3.05 → 2.2 at N=1000), no GET before writing back drift. Earlier: children\n\
           read from the owned watches' caches instead of a GET per reconcile, the two children\n\
           applied in parallel, Events published off the reconcile path, concurrency 16 (ratio\n\
           2.12 → 1.49, drift p50 127 → 14 ms).\n\n\
         More: [`bench-scale.md`](bench-scale.md) (N = 100 … 10,000, `make bench-scale`) and, on the\n\
         real node with real PostgreSQL, [`bench/ha.md`](bench/ha.md) (failover and switchover\n\
         write downtime over 10 runs each, `make bench-ha`).\n",
        cpu = m["cpu"].as_str().unwrap_or("?"),
        cores = m["cores"],
        mem = m["memory_gib"],
        k8s = results["kubernetes"].as_str().unwrap_or("?"),
        cmd = results["operator_cmd"].as_str().unwrap_or("?"),
        reverts = w["reverts_audited"],
        re50 = w["reaction_ms"]["p50"],
        re99 = w["reaction_ms"]["p99"],
        v_reaction = verdict(
            w["reaction_ms"]["p50"].as_f64().is_some_and(|p| p <= 3.0)
                && w["reaction_ms"]["p99"].as_f64().is_some_and(|p| p <= 10.0)
        ),
        ow50 = w["outsider_write_ms"]["p50"],
        ow99 = w["outsider_write_ms"]["p99"],
        in_op = {
            let d = &w["reaction_in_operator"];
            if d.is_null() {
                "not reported by this operator".to_string()
            } else {
                format!(
                    "{} / ≤ {} / ≤ {} ms ({} reverts)",
                    d["mean_ms"],
                    d["p50_at_most_ms"],
                    d["p99_at_most_ms"],
                    d["count"].as_f64().unwrap_or_default()
                )
            }
        },
        in_op_mean = w["reaction_in_operator"]["mean_ms"].as_f64().map_or("–".into(), |ms| ms.to_string()),
        rw50 = w["revert_write_ms"]["p50"],
        rw99 = w["revert_write_ms"]["p99"],
        span = match w["revert_span_ms"].as_object() {
            Some(span) => format!("{} / {} / {} ms", span["p50"], span["p99"], span["max"]),
            None => "not measured in this run".into(),
        },
        compared_row = compared_row,
        managers_after_merge = managers_after_merge,
        quiet_ms = w["drift_quiet_ms"].as_u64().map_or("?".into(), |ms| ms.to_string()),
        started_quiet = w["drift_started_quiet"].as_u64().map_or("?".into(), |n| n.to_string()),
        binary_mb = results["operator_binary_mb"].as_f64().map_or("?".into(), |mb| mb.to_string()),
        n = w["n"],
        conv = w["convergence_s"],
        children = w["children_s"],
        direct = w["direct_s"],
        ratio = w["ratio"],
        v_ratio = verdict(ratio <= 1.10),
        per_app = w["convergence_writes_per_webapp"],
        writes = w["convergence_writes"],
        v_writes = verdict(per_app <= 3.0),
        trials = w["drift_trials"],
        p50 = w["drift_ms"]["p50"],
        p90 = w["drift_ms"]["p90"],
        p99 = w["drift_ms"]["p99"],
        max = w["drift_ms"]["max"],
        v_drift = verdict(p99 <= 20.0),
        idle_s = w["idle_seconds"],
        idle = w["idle_writes"],
        v_idle = verdict(idle == 0),
        rss_peak = w["rss_peak_mb"],
        v_rss = verdict(rss <= 25.0),
        rss_rest = w["rss_rest_mb"],
        rss_anon = w["rss_rest_anon_mb"],
        rss_file = w["rss_rest_file_mb"],
        cpu_s = w["cpu_s"],
        cpu_row = cpu_row,
        cpu_text = cpu_text,
        cluster_text = cluster_text,
        r_ready = r["ready_s"],
        v_r_ready = verdict(restart_ready <= 5.0),
        r_idle = r["idle_s"],
        r_writes = r["writes"],
        v_r_writes = verdict(restart_writes == 0),
        r_rss = r["rss_peak_mb"],
        dn = d["n"],
        dconv = d["convergence_s"],
        drss = d["rss_mb"],
    )
}

/// What the rest of the cluster wrote in each run's namespace while that run's
/// clock ran: the paragraph that reads it, or nothing when the run did not count it.
fn unfinished_work(n: f64, writes: &Value) -> String {
    let (Some(direct), Some(operator)) = (writes["direct"].as_object(), writes["operator"].as_object()) else {
        return String::new();
    };
    let sum = |counts: &serde_json::Map<String, Value>, wanted: &dyn Fn(&str) -> bool| -> u64 {
        counts.iter().filter(|(kind, _)| wanted(kind)).filter_map(|(_, n)| n.as_u64()).sum()
    };
    let both = |wanted: &dyn Fn(&str) -> bool| format!("{} · {}", sum(direct, wanted), sum(operator, wanted));
    let kcm_events = |kind: &str| kind == "kube-controller-manager create events";
    let reading = if sum(direct, &kcm_events) < sum(operator, &kcm_events) {
        "The\n\
  controller manager sends Events at a limited rate: what the direct run's window leaves\n\
  undone comes after its clock stopped, or is refused once its namespace is deleted, while the\n\
  operator run, whose children come later, holds more of it. So the CPU totals above are not\n\
  the same work, and their ratio overstates what the operator adds."
    } else {
        "In this\n\
  run the direct window held as many of them as the operator's: the CPU totals above are the\n\
  same work."
    };
    format!(
        "- The direct run's clock stops while the rest of the cluster still has work queued for its\n\
  objects. While each run's clock ran, the cluster's components wrote in that run's namespace\n\
  (direct · operator): {total} writes in all, controller manager {kcm}, of them {status}\n\
  Deployment status updates (conflicts included) and {events} Events, of the {owed} Events each run\n\
  owes (a Deployment's scale-up and its ReplicaSet's pod creation, one each per WebApp). {reading}\n",
        total = both(&|_| true),
        kcm = both(&|kind| kind.starts_with("kube-controller-manager ")),
        status = both(&|kind| kind.starts_with("kube-controller-manager ") && kind.ends_with(" deployments/status")),
        events = both(&kcm_events),
        owed = 2.0 * n,
    )
}

/// The CPU table row (core-seconds by process, direct · operator) and the
/// paragraph that reads it, or nothing when the run did not measure it.
fn cpu_account(n: f64, direct: &Value, operator: &Value) -> (String, String) {
    let (Some(direct_by), Some(operator_by)) = (direct["by_process"].as_object(), operator["by_process"].as_object())
    else {
        return (String::new(), String::new());
    };
    let seconds = |by: &serde_json::Map<String, Value>, name: &str| by.get(name).and_then(Value::as_f64);
    let parts = operator_by
        .keys()
        .map(|name| {
            let shown = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
            format!("{name} {} · {}", shown(seconds(direct_by, name)), shown(seconds(operator_by, name)))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let row = format!(
        "| CPU during convergence, core-seconds, direct · operator: {parts} | total {} · {} (machine busy {} · {} of {} cores) | | |\n",
        direct["total_s"],
        operator["total_s"],
        direct["machine_busy_cores"],
        operator["machine_busy_cores"],
        operator["machine_cores"],
    );
    let keelson_cpu = seconds(operator_by, "keelson").unwrap_or(0.0);
    // What the operator run must add to the direct run's work: each WebApp's creation (1.7 ms of
    // API-server CPU, measured alone) and status write (about 3 ms), and the operator's own CPU.
    let extra = n * 0.0047 + keelson_cpu;
    let floor = direct["total_s"].as_f64().filter(|total| *total > 0.0).map_or(f64::NAN, |total| 1.0 + extra / total);
    let text = format!(
        "- Convergence is bounded by the machine's CPU: in both runs its cores are busy ({} and {} of\n\
  {} cores), so a run lasts as long as the CPU the cluster needs for it, and the ratio follows the\n\
  ratio of the CPU totals ({} and {} core-seconds; by process in the row above, the operator's\n\
  own {:.1}). Measured alone on this machine (500 requests, 16 at once, controller manager\n\
  stopped), the API server's CPU per request: a WebApp's creation 1.7 ms, its status patch about\n\
  3 ms, a GET 1.3 ms, a Deployment's server-side apply 3.5 ms against 2.1 ms for a create, a\n\
  Service's 8-13 ms against 6-10 ms. So the operator's requests beyond the direct run's cost the\n\
  API server about 10 ms per WebApp (server-side apply about 4 ms of it), 10 core-seconds at\n\
  N=1000. The rest of a difference is what the other components do, and it varies more from run\n\
  to run than the operator's share. Three runs of one commit (47a4e0b) at N=1000, 3000 writes each,\n\
  spent 80, 101 and 107 core-seconds (41.0, 51.6 and 53.9 s: ratio 1.06, 1.26 and 1.36, the\n\
  last with reads audited too) against 76-80 for the direct runs before them. Before Keelson had\n\
  its own reconcile queue, runs spent 131-135 core-seconds (63-69 s, ratio 1.37-1.70, with\n\
  600-2500 GETs) against 77-90.\n\
- A floor under the ratio: a WebApp's creation and its one status write, which the direct run\n\
  does not make, cost the API server about 4.7 ms together; with the operator's own CPU that is\n\
  {extra:.1} core-seconds beyond this direct run's {direct_total}, so a ratio of at least {floor:.2} here even if\n\
  every other component did exactly the direct run's work and the children cost no more than\n\
  the direct run's creates.\n",
        direct["machine_busy_cores"],
        operator["machine_busy_cores"],
        operator["machine_cores"],
        direct["total_s"],
        operator["total_s"],
        keelson_cpu,
        extra = extra,
        direct_total = direct["total_s"],
        floor = floor,
    );
    (row, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_clusters_unfinished_work_is_read_from_both_windows() {
        let writes = json!({
            "direct": {"kube-controller-manager create events": 1127, "kube-controller-manager update deployments/status": 3729,
                       "kube-scheduler create events": 998, "kwok patch pods/status": 1000},
            "operator": {"kube-controller-manager create events": 1667, "kube-controller-manager update deployments/status": 4833,
                         "kube-scheduler create events": 998, "kwok patch pods/status": 1000},
        });
        let text = unfinished_work(1000.0, &writes);
        assert!(text.contains("6854 · 8498 writes in all"), "{text}");
        assert!(text.contains("controller manager 4856 · 6500"), "{text}");
        assert!(text.contains("3729 · 4833\nDeployment status"), "{text}");
        assert!(text.contains("1127 · 1667 Events, of the 2000 Events"), "{text}");
        assert!(text.contains("ratio overstates"), "{text}");
        let even = json!({"direct": {"kube-controller-manager create events": 2000},
                          "operator": {"kube-controller-manager create events": 2000}});
        assert!(!unfinished_work(1000.0, &even).contains("overstates"), "said only when the windows differ");
        assert_eq!(unfinished_work(1000.0, &json!({"direct": null, "operator": {}})), "", "not counted: nothing said");
    }
}
