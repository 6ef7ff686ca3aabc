//! A worker pod may start before its coordinator: it must wait and retry, not exit.

use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn waits_for_an_unreachable_coordinator() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rhosynth-worker"))
        .args(["--coordinator", &format!("http://127.0.0.1:{port}"), "--name", "early"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none(), "the worker exited instead of retrying");
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator not reachable; retrying"));
}
