//! Faults a test causes on the real node's processes (a container's
//! processes are this machine's).

use k8s_openapi::api::core::v1::Pod;

/// The host pid of the postmaster in `pod` (on the real node a container's
/// processes are this machine's): its cgroup names the pod, its command line
/// carries `cluster_name` (keelson-postgres.sh starts it so), and its parent's
/// does not. A backend just forked still has the postmaster's command line
/// until it sets its title; once pids wrap (32768 here), it can come first.
pub fn postmaster_pid(pod: &Pod) -> anyhow::Result<u32> {
    let postgres = |arg: &[u8]| arg.starts_with(b"cluster_name=");
    // A process gone meanwhile (its stat unreadable) counts as a backend: it is not the one.
    let parent_is_postgres = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) state ppid …`: the command may hold spaces, so after its `)`.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        ppid.is_none_or(|ppid| {
            std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default().split(|b| *b == 0).any(postgres)
        })
    };
    process_pid(pod, |pid, arg| postgres(arg) && !parent_is_postgres(pid), "postmaster")
}

/// The host pid of the WAL receiver in `pod` (its process title names it).
pub fn walreceiver_pid(pod: &Pod) -> anyhow::Result<u32> {
    process_pid(pod, |_, arg| arg.windows(11).any(|w| w == b"walreceiver"), "WAL receiver")
}

fn process_pid(pod: &Pod, marks: impl Fn(u32, &[u8]) -> bool, what: &str) -> anyhow::Result<u32> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let in_pod = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&format!("pod{uid}")))
    };
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let Ok(number) = pid.parse::<u32>() else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).any(|arg| marks(number, arg)) && in_pod(&pid) {
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
