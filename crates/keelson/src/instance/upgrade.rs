//! The instance manager replaced in place, with PostgreSQL left running: the
//! operator runs `keelson instance install <folder>/keelson.next --image IMG`
//! in the pod (an ephemeral container of its own, newer image; see
//! `mydatabase::upgrade`). The running manager finds the new binary beside
//! itself, checks that it runs here, puts it in its own place and executes it
//! in its own process: neither PostgreSQL's container nor the manager's
//! restarts, and PostgreSQL's heartbeat check never sees a gap.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::InstanceError;

/// Where `install` leaves a binary for the running manager to take up.
pub const NEXT: &str = "keelson.next";
/// Where a new binary that does not run here is set aside (not tried again).
const REJECTED: &str = "keelson.rejected";
/// How long the new binary may take to print its version. Short: the manager's loop, which renews
/// a primary's lease every 2 s (it expires after 8 s), waits for it.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The file beside `binary` that names the image it came from.
pub fn image_file(binary: &Path) -> PathBuf {
    let mut name = binary.as_os_str().to_owned();
    name.push(".image");
    PathBuf::from(name)
}

/// The image the binary at `exe` was installed from, if `install` recorded it.
pub fn installed_image(exe: &Path) -> Option<String> {
    let image = std::fs::read_to_string(image_file(exe)).ok()?;
    Some(image.trim().to_string()).filter(|image| !image.is_empty())
}

/// A new binary waiting beside `exe`, if one is.
pub fn waiting(exe: &Path) -> Option<PathBuf> {
    let next = exe.with_file_name(NEXT);
    next.is_file().then_some(next)
}

/// Checks that `next` runs here, puts it and its image file in the place of
/// `exe`, and executes it with this process's arguments and environment.
/// Returns only if that failed; a binary that does not run is set aside.
pub async fn take_up(exe: &Path, next: &Path) -> InstanceError {
    let error =
        |source| InstanceError::Install { from: next.display().to_string(), to: exe.display().to_string(), source };
    let check = tokio::process::Command::new(next).arg("--version").kill_on_drop(true).output();
    let runs = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => Err(format!("`{} --version` ended with {}", next.display(), output.status)),
        Ok(Err(error)) => Err(format!("cannot run {}: {error}", next.display())),
        Err(_) => Err(format!("`{} --version` did not end within {CHECK_TIMEOUT:?}", next.display())),
    };
    if let Err(why) = runs {
        let _ = std::fs::rename(next, exe.with_file_name(REJECTED));
        return error(std::io::Error::other(why));
    }
    // The binary before its image file: a manager stopped in between reports the old image, and is
    // upgraded again, rather than reporting a new image it does not run.
    if let Err(source) = std::fs::rename(next, exe) {
        return error(source);
    }
    if let Err(source) = std::fs::rename(image_file(next), image_file(exe)) {
        // Not fatal: the manager then reports no image, and the operator upgrades it again.
        tracing::warn!(%source, "cannot put the new instance manager's image file in place");
    }
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    error(std::process::Command::new(exe).args(args).exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_file_sits_beside_its_binary() {
        assert_eq!(image_file(Path::new("/keelson/keelson")), Path::new("/keelson/keelson.image"));
        assert_eq!(image_file(Path::new("/install/keelson.next")), Path::new("/install/keelson.next.image"));
    }

    #[test]
    fn an_installed_binary_is_found_with_its_image() {
        let dir = std::env::temp_dir().join(format!("keelson-upgrade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let exe = dir.join("keelson");
        assert_eq!(waiting(&exe), None, "nothing installed yet");
        super::super::install(&dir.join(NEXT), Some("keelson:2.0.0")).expect("installs");
        let next = waiting(&exe).expect("the new binary is waiting");
        assert_eq!(installed_image(&next).as_deref(), Some("keelson:2.0.0"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_binary_that_does_not_run_is_set_aside() {
        let dir = std::env::temp_dir().join(format!("keelson-rejected-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let exe = dir.join("keelson");
        std::fs::write(&exe, "the running binary").expect("write");
        let next = dir.join(NEXT);
        std::fs::write(&next, "not a program").expect("write");
        let error = take_up(&exe, &next).await;
        assert!(error.to_string().contains("keelson.next"), "{error}");
        assert_eq!(waiting(&exe), None, "not tried again");
        assert!(dir.join(REJECTED).exists());
        assert_eq!(std::fs::read_to_string(&exe).expect("read"), "the running binary", "kept");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
