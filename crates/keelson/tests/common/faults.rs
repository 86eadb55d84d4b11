//! Faults a test causes on the real node's processes (a container's
//! processes are this machine's).

use k8s_openapi::api::core::v1::Pod;

/// The host pid of the postmaster in `pod` (on the real node a container's
/// processes are this machine's): its cgroup names the pod, its command line
/// carries `cluster_name` (keelson-postgres.sh starts it so).
pub fn postmaster_pid(pod: &Pod) -> anyhow::Result<u32> {
    process_pid(pod, |arg| arg.starts_with(b"cluster_name="), "postmaster")
}

/// The host pid of the WAL receiver in `pod` (its process title names it).
pub fn walreceiver_pid(pod: &Pod) -> anyhow::Result<u32> {
    process_pid(pod, |arg| arg.windows(11).any(|w| w == b"walreceiver"), "WAL receiver")
}

fn process_pid(pod: &Pod, marks: impl Fn(&[u8]) -> bool, what: &str) -> anyhow::Result<u32> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let in_pod = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&format!("pod{uid}")))
    };
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let Ok(number) = pid.parse::<u32>() else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).any(&marks) && in_pod(&pid) {
            return Ok(number);
        }
    }
    anyhow::bail!("no {what} of pod {uid} among this machine's processes")
}

/// `kill SIGNAL pid`, e.g. `-STOP`.
pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status()?;
    anyhow::ensure!(status.success(), "kill {signal} {pid}: {status}");
    Ok(())
}
