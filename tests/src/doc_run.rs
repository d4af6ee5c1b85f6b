//! Runs the commands of a Markdown document and checks the answers it shows, so that a document
//! cannot drift from what the broker does (the README's tour: `tests/tests/readme.rs`).
//!
//! What it reads, in document order:
//! - a ```` ```console ```` block: lines starting with `$ ` are commands (a `<<'TAG'` heredoc
//!   takes the lines up to `TAG` with it); the lines after a command, up to the next one, are
//!   its standard output. In them `…` stands for any text within a line, and a line holding only
//!   `…` for any number of lines; runs of spaces count as one (table columns are as wide as their
//!   widest value). A command ending in `&` runs in the background (its output goes to a file,
//!   [`Session::background_output`]); `cd DIR` changes the directory of the commands after it.
//! - `<!-- readme-test: file PATH -->` before a fenced block: the block is written to `PATH`
//!   (relative to the current directory) at that point of the run.
//!
//! Commands run in `bash -c` with the session's environment, each for at most 10 minutes. A
//! command that shows what delivery did (see [`shows_delivery`]) is run again, for up to 30 s,
//! until its output matches: delivery is asynchronous, and the document shows what the user sees
//! once the broker has delivered what came before. Every other command must answer as shown the
//! first time (a pull right after its produce's ACK included). Processes started in the
//! background are killed when the session ends, and when the test process dies.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One step of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run `command`; its stdout must match `expected`.
    Run {
        /// The shell command (heredoc lines included).
        command: String,
        /// The lines the document shows after it.
        expected: Vec<String>,
        /// The document's line of the command, for messages.
        line: usize,
    },
    /// Write `text` to `path`.
    File {
        /// Relative to the current directory.
        path: String,
        /// The block's text.
        text: String,
    },
}

const FILE_MARKER: &str = "<!-- readme-test: file ";

/// The steps of a Markdown document whose first line is line `first_line` of its file (messages
/// name lines of the file).
pub fn steps(markdown: &str, first_line: usize) -> Vec<Step> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    let mut pending_file: Option<String> = None;
    while i < lines.len() {
        let line = lines[i];
        if let Some(rest) = line.strip_prefix(FILE_MARKER) {
            pending_file = Some(rest.trim_end_matches("-->").trim().to_owned());
            i += 1;
            continue;
        }
        let Some(info) = line.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or_else(|| panic!("line {}: the block is never closed", i + 1));
        let block = &lines[i + 1..end];
        if let Some(path) = pending_file.take() {
            let mut text = block.join("\n");
            text.push('\n');
            steps.push(Step::File { path, text });
        } else if info.trim() == "console" {
            steps.extend(console_steps(block, first_line + i + 1));
        }
        i = end + 1;
    }
    steps
}

/// The commands and outputs of one console block whose first line is line `first` of the file.
fn console_steps(block: &[&str], first: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut j = 0;
    while j < block.len() {
        let Some(command) = block[j].strip_prefix("$ ") else {
            panic!("line {}: output before any command", first + j);
        };
        let line = first + j;
        let mut command = command.to_owned();
        j += 1;
        if let Some(tag) = heredoc_tag(&command) {
            while j < block.len() {
                command.push('\n');
                command.push_str(block[j]);
                j += 1;
                if block[j - 1] == tag {
                    break;
                }
            }
        }
        let mut expected = Vec::new();
        while j < block.len() && !block[j].starts_with("$ ") {
            expected.push(block[j].to_owned());
            j += 1;
        }
        steps.push(Step::Run {
            command,
            expected,
            line,
        });
    }
    steps
}

/// `TAG` of a `<<'TAG'` or `<<TAG` heredoc in `command`.
fn heredoc_tag(command: &str) -> Option<String> {
    let rest = &command[command.find("<<")? + 2..];
    let tag: String = rest
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!tag.is_empty()).then_some(tag)
}

/// Whether a command shows what asynchronous delivery did (and only reads), so running it again
/// until its output matches changes nothing and hides no failure of a synchronous answer.
pub fn shows_delivery(command: &str) -> bool {
    [
        "mmmq dispatchers",
        "mmmq dlq list",
        "mmmq plugin logs",
        "mmmq groups",
    ]
    .iter()
    .any(|r| command.starts_with(r))
}

/// Whether `actual` (stdout) is what the document shows as `expected`.
pub fn matches(expected: &[String], actual: &str) -> bool {
    let expected: Vec<String> = expected.iter().map(|l| squeeze(l)).collect();
    let actual: Vec<String> = actual.lines().map(squeeze).collect();
    lines_match(&expected, &actual)
}

fn squeeze(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "…" => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => {
            !actual.is_empty() && line_matches(first, &actual[0]) && lines_match(rest, &actual[1..])
        }
    }
}

/// `…` in `pattern` stands for any text (possibly none).
fn line_matches(pattern: &str, line: &str) -> bool {
    let mut parts = pattern.split('…');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (k, part) in parts.iter().enumerate() {
        if k == parts.len() - 1 {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Makes the process `cmd` starts get SIGTERM when this one dies (a `cargo test` interrupted, or
/// killed by a CI timeout, runs no `Drop`): a broker or a consumer a document started must not
/// outlive its test.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe and touches only the child being made.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

/// Where and how a document's commands run.
pub struct Session {
    /// The current directory.
    pub dir: PathBuf,
    /// Environment variables every command gets.
    pub env: Vec<(String, String)>,
    /// Text replaced in commands, files and expected output (a port, a target dir).
    pub replace: Vec<(String, String)>,
    background: Vec<(Child, PathBuf)>,
}

impl Session {
    /// A session in `dir`.
    pub fn new(dir: &Path) -> Self {
        Session {
            dir: dir.to_owned(),
            env: Vec::new(),
            replace: Vec::new(),
            background: Vec::new(),
        }
    }

    fn substitute(&self, text: &str) -> String {
        self.replace
            .iter()
            .fold(text.to_owned(), |t, (from, to)| t.replace(from, to))
    }

    fn bash(&self, command: &str) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args(["600", "bash", "-c"])
            .arg(command)
            .current_dir(&self.dir);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs every step, panicking with the command, what it printed and what was expected at
    /// the first that does not do what the document says.
    pub fn run(&mut self, steps: &[Step]) {
        for step in steps {
            match step {
                Step::File { path, text } => {
                    let path = self.dir.join(path);
                    std::fs::write(&path, self.substitute(text))
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                }
                Step::Run {
                    command,
                    expected,
                    line,
                } => self.run_one(command, expected, *line),
            }
        }
    }

    fn run_one(&mut self, command: &str, expected: &[String], line: usize) {
        let command = self.substitute(command);
        let expected: Vec<String> = expected.iter().map(|l| self.substitute(l)).collect();
        if let Some(dir) = command.strip_prefix("cd ") {
            self.dir = self.dir.join(dir.trim());
            assert!(self.dir.is_dir(), "line {line}: no directory {dir}");
            return;
        }
        if let Some(fg) = command.trim_end().strip_suffix('&') {
            let out = self
                .dir
                .join(format!(".background-{}.out", self.background.len()));
            let file = std::fs::File::create(&out).unwrap();
            let err = std::fs::File::create(out.with_extension("err")).unwrap();
            let mut cmd = Command::new("bash");
            cmd.arg("-c")
                .arg(format!("exec {fg}"))
                .current_dir(&self.dir);
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let child = die_with_parent(cmd.stdout(file).stderr(err).process_group(0))
                .spawn()
                .unwrap();
            self.background.push((child, out));
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.bash(&command).stdin(Stdio::null()).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let ok = out.status.success() && matches(&expected, &stdout);
            if ok {
                return;
            }
            if !(out.status.success() && shows_delivery(&command) && Instant::now() < deadline) {
                panic!(
                    "line {line}: `{command}` ({}) printed\n{stdout}\nstderr:\n{}\nexpected\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr),
                    expected.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the `n`th background command has printed so far: its stdout, and its stderr.
    pub fn background_output(&self, n: usize) -> (String, String) {
        let out = &self.background[n].1;
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        (read(out), read(&out.with_extension("err")))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for (child, _) in &mut self.background {
            // The whole process group: `bash -c` may have forked.
            let _ = Command::new("kill")
                .arg("--")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn wildcards_match_text_and_lines_and_nothing_else() {
        assert!(matches(
            &lines(&["{\"a\":…,\"b\":2}"]),
            "{\"a\":17,\"b\":2}\n"
        ));
        assert!(!matches(
            &lines(&["{\"a\":…,\"b\":2}"]),
            "{\"a\":17,\"b\":3}\n"
        ));
        assert!(matches(&lines(&["x  …  y"]), "x 1 2   y\n"));
        assert!(!matches(&lines(&["x"]), "x\ny\n"));
        assert!(!matches(&lines(&["x", "y"]), "x\n"));
        assert!(matches(&lines(&["…", "ok …", "…"]), "a\nb\nok 1\nc\n"));
        assert!(matches(&lines(&["…"]), ""));
        assert!(!matches(&lines(&["…", "ok"]), "a\nok 1\n"));
        assert!(matches(&lines(&["…x"]), "abcx\n"));
        assert!(!matches(&lines(&["…x"]), "abcxy\n"));
        assert!(matches(&lines(&[]), ""));
        assert!(!matches(&lines(&[]), "unexpected\n"));
    }

    #[test]
    fn console_blocks_heredocs_and_files_become_steps() {
        let md = "text\n<!-- readme-test: file a.py -->\n```python\nprint(1)\n```\n\n```console\n$ cat > f <<'JSON'\n[1,\n 2]\nJSON\n$ echo hi\nhi\n```\n```sh\nnot run\n```\n";
        assert_eq!(
            steps(md, 1),
            vec![
                Step::File {
                    path: "a.py".into(),
                    text: "print(1)\n".into()
                },
                Step::Run {
                    command: "cat > f <<'JSON'\n[1,\n 2]\nJSON".into(),
                    expected: vec![],
                    line: 8
                },
                Step::Run {
                    command: "echo hi".into(),
                    expected: vec!["hi".into()],
                    line: 12
                },
            ]
        );
    }
}
