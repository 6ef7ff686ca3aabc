//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rhosynth_privacy::ledger::Ledger;
use rhosynth_shared::accounting::accountant::Accountant;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::input::InputReader;
use rhosynth_shared::data::source::Format;
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;
#[allow(unused_imports)]
pub use rhosynth_shared::testing::{generator, with_generator};

/// A workspace binary (`rhosynth`, `rhosynth-worker`), built by `cargo test --workspace`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target directory");
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: run `cargo test --workspace` (it builds every binary)", path.display());
    path
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// The demo spec with its input, output and ledger moved under `dir`.
pub fn demo_spec(dir: &Path, patients: usize) -> String {
    let input = dir.join("icu_vitals.csv");
    std::fs::write(&input, rhosynth_shared::simulate::icu_vitals_csv(patients, 7)).unwrap();
    std::fs::read_to_string(repo().join("examples/demo.toml"))
        .unwrap()
        .replace("./rhosynth-out/demo/input/icu_vitals.csv", input.to_str().unwrap())
        .replace("./rhosynth-out/ledger", dir.join("ledger").to_str().unwrap())
        .replace("./rhosynth-out/demo/synthetic", dir.join("out").to_str().unwrap())
}

/// A child process that is killed when dropped; its stderr lines are forwarded.
pub struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  | {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Forgets the lines seen so far.
    pub fn drain(&self) {
        while self.lines.try_recv().is_ok() {}
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        self.line_with(needle, timeout).is_some()
    }

    /// The next stderr line containing `needle`, waiting up to `timeout` for it.
    pub fn line_with(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The JSON on the last line of a process's stdout.
pub fn last_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    serde_json::from_str(text.lines().last().unwrap_or("null")).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The manifest under an output directory, if complete.
pub fn manifest(dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("_manifest.json")).ok()?;
    Some(serde_json::from_str(&text).unwrap())
}

/// (charges, ε spent) of a dataset's ledger; (0, 0) when it does not exist.
pub async fn ledger_state(store: &Path, dataset: &str) -> (usize, f64) {
    let location = storage::open(store.to_str().unwrap()).unwrap();
    match Ledger::open(&location, dataset).await {
        Ok(l) => (l.charges().len(), l.spent().unwrap().epsilon),
        Err(_) => (0, 0.0),
    }
}

/// The accountant a manifest's cost is stated under.
pub fn manifest_accountant(manifest: &serde_json::Value) -> Accountant {
    serde_json::from_value(manifest["privacy"]["accountant"].clone()).unwrap()
}

/// A dataset's ledger total under one accountant: the ledger keeps the smaller of its
/// RDP and PLD totals, so a job's own cost is compared with the total under its accountant.
pub async fn ledger_total_under(store: &Path, dataset: &str, accountant: Accountant) -> f64 {
    let location = storage::open(store.to_str().unwrap()).unwrap();
    let ledger = Ledger::open(&location, dataset).await.unwrap();
    ledger.spent().unwrap().under(accountant).expect("every charge has an analysis under this accountant")
}

/// Normalised 1-way histograms over the spec's public bins of the given files.
pub async fn histograms(spec: &JobSpec, urls: Vec<String>, format: Format) -> Vec<Vec<f64>> {
    let mut input = spec.input.of_files(&urls);
    input.format = Some(format);
    let domain = Domain::from_spec(spec);
    let mut counts: Vec<Vec<f64>> = domain.columns.iter().map(|c| vec![0.0; c.bins()]).collect();
    let mut reader = InputReader::new(&input, &spec.schema, &domain);
    while let Some(batch) = reader.next_batch().await.unwrap() {
        for (d, column) in domain.columns.iter().enumerate() {
            for v in &batch.values[d] {
                counts[d][column.bin(*v)] += 1.0;
            }
        }
    }
    counts
        .into_iter()
        .map(|c| {
            let total: f64 = c.iter().sum();
            c.into_iter().map(|x| x / total).collect()
        })
        .collect()
}

/// Total-variation distance between two distributions.
pub fn tv(a: &[f64], b: &[f64]) -> f64 {
    0.5 * a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>()
}

/// The Parquet parts a manifest lists, as paths.
pub fn parts(dir: &Path, manifest: &serde_json::Value) -> Vec<String> {
    manifest["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| dir.join(p["path"].as_str().unwrap()).to_str().unwrap().to_string())
        .collect()
}

/// The demo spec turned into a small DP-FinDiff job (patients are units of up to 8 rows).
pub fn findiff_spec(dir: &Path, patients: usize, epochs: f64) -> String {
    with_generator(
        &demo_spec(dir, patients),
        &format!(
            "[generator]\nname = \"findiff\"\n\n[generator.findiff]\nmax_rows_per_unit = 8\nhidden = 32\ndiffusion_steps = 100\nsampling_steps = 20\n\n[generator.findiff.run]\nbatch_size = 32\nepochs = {epochs}"
        ),
    )
}

/// The demo spec turned into a small sequence job: whole patient histories (at most
/// `max_rows` rows each), a one-block transformer, one epoch.
pub fn sequence_spec(dir: &Path, patients: usize, max_rows: usize) -> String {
    with_generator(
        &demo_spec(dir, patients),
        &format!(
            "[generator]\nname = \"sequence\"\n\n[generator.sequence]\nmax_rows = {max_rows}\nwindow_rows = 4\ncontext_rows = 1\nwidth = 16\nheads = 2\nlayers = 1\nmlp = 32\n\n[generator.sequence.run]\nbatch_size = 16\nepochs = 1.0"
        ),
    )
}

/// The demo spec turned into a small PATE job: `teachers` partitions, patients as units,
/// at most two iterations of small models, the output size declared (no count release).
pub fn pate_spec(dir: &Path, patients: usize, teachers: u32) -> String {
    let text = demo_spec(dir, patients).replace("partitions = 4\n", &format!("partitions = {teachers}\n"));
    with_generator(
        &text,
        "[generator]\nname = \"pate\"\n\n[generator.pate]\nsigma = 40.0\nqueries_per_iteration = 16\nmax_iterations = 2\nfake_rows = 64\nstudent_steps = 3\ngenerator_steps = 2\nbatch_size = 16\ngenerator_width = 16\nlatent = 8\nd_model = 16\nlayers = 1",
    ) + "rows = 50\n"
}

/// The number of answered queries a PATE job's manifest reports (the coordinator's own
/// count of what it released).
pub fn pate_answered(manifest: &serde_json::Value) -> u64 {
    let pate = manifest["privacy"]["public_inputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .find(|s| s.starts_with("PATE:"))
        .expect("the PATE release is described");
    pate.split(" answered queries").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap()
}

/// Sets field `index` of a comma-separated line.
pub fn set_field(line: &mut String, index: usize, value: &str) {
    let mut fields: Vec<&str> = line.split(',').collect();
    fields[index] = value;
    *line = fields.join(",");
}

/// What a submitter is told when a job's input does not match its schema (whatever the
/// input: no file, column or row).
pub fn input_mismatch_message() -> String {
    format!("{} (details are in the coordinator's operator log)", rhosynth_coordinator::job::INPUT_MISMATCH)
}

/// `rhosynth validate SPEC [args]`: (exit status, the JSON report, stderr).
pub fn validate(spec: &Path, args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, serde_json::Value, String) {
    let out = Command::new(bin("rhosynth"))
        .arg("validate")
        .arg(spec)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("run rhosynth validate");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("{stderr}");
    (out.status.code(), last_json(&out.stdout), stderr)
}

// --- Certificates for the TLS tests, made with the `openssl` command line.

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A self-signed CA: `name.pem`, `name.key`.
pub fn ca(dir: &Path, name: &str) {
    let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN={name}"));
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2", "-subj", &subject];
    args.extend(EC);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    args.extend(["-keyout", &key, "-out", &pem]);
    openssl(dir, &args);
}

/// A leaf certificate `name.pem`/`name.key` signed by CA `ca`, with `extensions`.
pub fn issue(dir: &Path, ca: &str, name: &str, extensions: &str) {
    let (key, csr, pem, ext) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
    std::fs::write(dir.join(&ext), format!("basicConstraints=CA:FALSE\n{extensions}\n")).unwrap();
    let subject = format!("/CN={name}");
    let mut args = vec!["req", "-new", "-nodes", "-subj", &subject, "-keyout", &key, "-out", &csr];
    args.extend(EC);
    openssl(dir, &args);
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

/// A database's release read back: each table's rows by column name, its part hashes
/// checked against the manifest.
pub fn read_database(out: &std::path::Path) -> (serde_json::Value, Vec<(String, Vec<arrow_array::RecordBatch>)>) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use sha2::Digest;
    let manifest = manifest(out).expect("manifest written");
    let mut tables = Vec::new();
    for table in manifest["tables"].as_array().expect("a database's manifest lists its tables") {
        let name = table["name"].as_str().unwrap().to_string();
        let mut batches = Vec::new();
        for part in table["parts"].as_array().unwrap() {
            let path = part["path"].as_str().unwrap();
            assert!(path.starts_with(&format!("{name}/")), "{path} under its table's folder");
            let bytes = std::fs::read(out.join(path)).unwrap();
            assert_eq!(format!("{:x}", sha2::Sha256::digest(&bytes)), part["sha256"].as_str().unwrap());
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap().build().unwrap();
            batches.extend(reader.map(Result::unwrap));
        }
        tables.push((name, batches));
    }
    (manifest, tables)
}

/// The values of column `name` of a table's batches, as `A`.
pub fn column<A: arrow_array::Array + Clone + 'static>(batches: &[arrow_array::RecordBatch], name: &str) -> Vec<A> {
    let column =
        |b: &arrow_array::RecordBatch| b.column_by_name(name).unwrap_or_else(|| panic!("column {name}")).clone();
    batches.iter().map(|b| column(b).as_any().downcast_ref::<A>().expect("the column's type").clone()).collect()
}

/// The strings of column `name` of a table's batches (keys), none missing.
pub fn keys(batches: &[arrow_array::RecordBatch], name: &str) -> Vec<String> {
    use arrow_array::Array;
    let strings = column::<arrow_array::StringArray>(batches, name);
    assert!(strings.iter().all(|s| s.null_count() == 0), "every row of {name} has its key");
    strings.iter().flat_map(|s| s.iter().map(|v| v.unwrap().to_string()).collect::<Vec<_>>()).collect()
}
