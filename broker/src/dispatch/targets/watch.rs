//! The hot reload's file watch (docs/plugins.md, "WebAssembly handlers"): a debounced watcher on the plugin
//! file's directory, so in-place writes, a rename over the file and an editor's temporary files
//! are all seen, and only the plugin's own name counts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, DebouncedEvent, Debouncer, new_debouncer};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::dispatch::target::BoxFuture;

/// How long a file must be quiet before it is reloaded (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(150);

/// Watches the plugin file's directory and reloads when the file changes. A directory that does
/// not exist yet is waited for: its nearest existing ancestor is watched (not recursively) until
/// it appears, so a plugin directory created after start is picked up without an admin reload.
/// `reload` is called on each change; `None` (the target is gone) ends the watch, as does
/// dropping the returned guard.
pub(super) fn watch_file(
    path: PathBuf,
    consumer_id: String,
    reload: impl Fn() -> Option<BoxFuture<'static, ()>> + Send + 'static,
) -> Option<DropGuard> {
    let dir = path.parent()?.to_owned();
    let name = path.file_name()?.to_owned();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let mut was_waiting = false;
        loop {
            let Some(watched) = dir.ancestors().find(|a| a.is_dir()).map(Path::to_owned) else {
                return;
            };
            let waiting = watched != dir;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let wanted = name.clone();
            let _debouncer = match start_watcher(&watched, move |events| {
                if waiting || events.iter().any(|e| e.path.file_name() == Some(&wanted)) {
                    let _ = tx.send(());
                }
            }) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(consumer_id, dir = %watched.display(), error = %e, "cannot watch for the plugin file; reload with POST /mmmq/admin/reload");
                    return;
                }
            };
            if waiting {
                if dir.is_dir() {
                    // It appeared while the watcher started.
                    was_waiting = true;
                    continue;
                }
                tracing::info!(consumer_id, dir = %dir.display(), watching = %watched.display(), "the plugin's directory does not exist yet; waiting for it");
            } else if was_waiting {
                // The directory appeared, perhaps with the file already in it.
                let Some(reloaded) = reload() else { return };
                reloaded.await;
            }
            was_waiting = waiting;
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    event = rx.recv() => if event.is_none() { return },
                }
                if waiting {
                    // Watch again from the directory itself or from a deeper ancestor.
                    if dir.ancestors().find(|a| a.is_dir()) != Some(watched.as_path()) {
                        break;
                    }
                    continue;
                }
                let Some(reloaded) = reload() else { return };
                reloaded.await;
            }
        }
    });
    Some(stop.drop_guard())
}

/// A debounced, non-recursive watch of `dir` calling `on_events` with each batch of events.
fn start_watcher(
    dir: &Path,
    on_events: impl Fn(&[DebouncedEvent]) + Send + 'static,
) -> Result<Debouncer<RecommendedWatcher>, notify_debouncer_mini::notify::Error> {
    let mut debouncer = new_debouncer(DEBOUNCE, move |res: DebounceEventResult| {
        if let Ok(events) = res {
            on_events(&events);
        }
    })?;
    debouncer
        .watcher()
        .watch(dir, RecursiveMode::NonRecursive)?;
    Ok(debouncer)
}
