//! The Python package as a user installs it: the wheel `.ci/run` builds (named by
//! `RHOSYNTH_WHEEL`) installed into a fresh virtual environment with pytest, pandas and
//! pyarrow from the package registry, and `python/tests` run there against it, the wheel's
//! own `rhosynth` binary doing the work (a served job's worker is this build's
//! `rhosynth-worker`; the Adult example runs where `../shared/data` is). Skipped loudly
//! without a wheel.

mod common;

use std::path::Path;
use std::process::Command;

/// Runs `program args` in `dir`; panics with its output unless it succeeds.
fn run(dir: &Path, program: &Path, args: &[&str]) -> String {
    let adult = common::repo().join("../shared/data/adult");
    let mut command = Command::new(program);
    if adult.join("adult.data").exists() {
        command.env("ADULT_DIR", adult.canonicalize().unwrap());
    }
    let out = command
        .args(args)
        .current_dir(dir)
        .env_remove("RHOSYNTH_BINARY")
        .env("RHOSYNTH_TEST_WORKER", common::bin("rhosynth-worker"))
        .env("RHOSYNTH_HOME", dir.join("home"))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{} {args:?} failed ({}):\n{text}", program.display(), out.status);
    text
}

#[test]
fn the_python_package_passes_its_tests_installed_from_its_wheel() {
    let Some(wheel) = std::env::var_os("RHOSYNTH_WHEEL") else {
        eprintln!("\n*** SKIPPED the Python package's tests: no wheel (RHOSYNTH_WHEEL, built by .ci/run) ***\n");
        return;
    };
    let tests = common::repo().join("python/tests");
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), Path::new("python3"), &["-m", "venv", "venv"]);
    let python = dir.path().join("venv/bin/python");
    let pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"];
    run(dir.path(), &python, &[&pip[..], &[wheel.to_str().unwrap(), "pytest", "tqdm"]].concat());
    // The package and binary are the wheel's, not the source tree's.
    let found = run(
        dir.path(),
        &python,
        &["-c", "import rhosynth, rhosynth.cli; print(rhosynth.__file__, rhosynth.cli.binary())"],
    );
    let venv = dir.path().join("venv").canonicalize().unwrap();
    assert!(found.split_whitespace().all(|p| Path::new(p).starts_with(&venv)), "{found}");
    let report = run(dir.path(), &python, &["-m", "pytest", "-q", "-p", "no:cacheprovider", tests.to_str().unwrap()]);
    eprintln!("{report}");
    assert!(report.contains(" passed") && !report.contains(" failed"), "{report}");
    if !report.contains(" skipped") {
        return;
    }
    // Only the Adult example may be skipped (without ../shared/data), never the rest.
    assert!(report.contains("1 skipped") && !common::repo().join("../shared/data/adult").exists(), "{report}");
}
