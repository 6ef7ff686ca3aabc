//! The coordinator's gRPC service: worker registration and liveness, task hand-out and
//! results, job submission and status, and a dataset's ledger as a submitter sees it.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rhosynth_privacy::ledger::{Ledger, LedgerError};
use rhosynth_privacy::summary;
use rhosynth_proto::coordinator_server::Coordinator;
use rhosynth_proto::result_chunk::Part;
use rhosynth_proto::{
    GetJobRequest, GetLedgerRequest, HeartbeatRequest, HeartbeatResponse, JobState, JobStatus, LedgerSummary,
    PROTOCOL_VERSION, PollTaskRequest, PollTaskResponse, RegisterWorkerRequest, RegisterWorkerResponse,
    ReportFailureRequest, ReportFailureResponse, ResultChunk, SubmitJobRequest, SubmitJobResponse,
    SubmitResultResponse, Task,
};
use rhosynth_shared::metrics::Exposition;
use rhosynth_shared::spec::JobSpec;
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Access, Submitter};
use crate::datasets::{Datasets, DatasetsError};
use crate::job::{JobEnv, JobRequest, Progress, ProgressHandle, evaluate_for_owner, run_job};
use crate::schedule::Schedule;
use crate::scheduler::Scheduler;
use crate::telemetry::Telemetry;
use crate::worker_result::{ResultError, ResultStream};

/// Tunables of a coordinator, with defaults for a single machine.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// How often workers heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which a worker is declared dead and its tasks requeued.
    pub worker_timeout: Duration,
    pub env: JobEnv,
    /// Operator-declared datasets (`serve --datasets`): jobs may name only these, and get
    /// their input and ledger from the declaration. `None`: the submitter's spec says
    /// (standalone `run`, `serve --dev`).
    pub datasets: Option<Datasets>,
    /// Who may call which RPC.
    pub access: Access,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(500),
            worker_timeout: Duration::from_secs(3),
            env: JobEnv {
                scratch_url: "./rhosynth-out/scratch".into(),
                default_ledger_url: "./rhosynth-out/ledger".into(),
                diagnostics_url: None,
                keep_trained_models: false,
                heartbeat: Default::default(),
                release_quantum: None,
            },
            datasets: None,
            access: Access::Open,
        }
    }
}

/// A job known to the coordinator.
struct JobEntry {
    progress: ProgressHandle,
    outcome: Option<Result<String, (JobState, String)>>,
    /// The job has ended and its evaluation report (for the data owner) is being written.
    diagnostics_pending: bool,
    /// The authenticated submitter that owns the job (`None` under open access).
    submitter: Option<String>,
    /// When it started and ended: a submitter of a served dataset sees its end at the
    /// boundary of its schedule (`CoordinatorService::submitter_status`).
    started: Instant,
    ended: Option<Instant>,
    /// Notified to cancel the job ([`CoordinatorService::cancel_job`]).
    cancel: Arc<Notify>,
}

/// The coordinator: scheduler, jobs and configuration behind the gRPC service.
#[derive(Clone)]
pub struct CoordinatorService {
    scheduler: Arc<Scheduler>,
    telemetry: Arc<Telemetry>,
    config: Arc<CoordinatorConfig>,
    jobs: Arc<Mutex<HashMap<String, JobEntry>>>,
    /// Declared datasets' ledgers as submitters read them, kept to be refreshed.
    ledgers: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Ledger>>>>>,
}

/// A fresh job id: time plus randomness, sortable.
pub fn new_job_id() -> String {
    let suffix: u32 = rand::random();
    format!("job-{}-{suffix:08x}", chrono::Utc::now().format("%Y%m%dT%H%M%S"))
}

impl CoordinatorService {
    /// Starts the reaper that declares silent workers dead.
    pub fn new(config: CoordinatorConfig) -> Self {
        let scheduler = Arc::new(Scheduler::new(config.worker_timeout));
        let reaper = Arc::downgrade(&scheduler);
        let period = config.worker_timeout / 4;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                match reaper.upgrade() {
                    Some(s) => s.reap(),
                    None => break,
                }
            }
        });
        Self {
            scheduler,
            telemetry: Arc::default(),
            config: Arc::new(config),
            jobs: Arc::default(),
            ledgers: Arc::default(),
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Starts a job in the background; returns its progress handle. A job id is taken
    /// once: the check and the insertion are one step, so two submissions of one id cannot
    /// both start.
    pub fn start_job(&self, mut request: JobRequest) -> Result<ProgressHandle, Status> {
        self.accept(&mut request, None)?;
        check_generator(&request)?;
        self.spawn_job(request, None)
    }

    /// Checks a request from the spec, the datasets and the submitter's grants alone (its
    /// generator's plan aside), binding it to its declared dataset.
    fn accept(&self, request: &mut JobRequest, submitter: Option<&Submitter>) -> Result<(), Status> {
        if let Some(s) = submitter
            && !s.datasets.contains(&request.spec.job.dataset_id)
        {
            return Err(Status::permission_denied(format!(
                "submitter '{}' may not run jobs on dataset '{}'",
                s.name, request.spec.job.dataset_id
            )));
        }
        rhosynth_shared::spec::validate_id("job id", &request.job_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        // A spec that names no output writes under its submitter's root, one folder a job.
        if let Some(s) = submitter
            && request.output_url.is_none()
            && request.spec.output.is_default()
        {
            request.output_url = Some(format!("{}/{}", s.output_root.trim_end_matches('/'), request.job_id));
        }
        if let Some(datasets) = &self.config.datasets {
            datasets.bind(request).map_err(|e| match e {
                DatasetsError::Unknown(_) => Status::not_found(e.to_string()),
                DatasetsError::UnitColumnMissing { .. } | DatasetsError::BelowMinJobEpsilon { .. } => {
                    Status::invalid_argument(e.to_string())
                }
                _ => Status::permission_denied(e.to_string()),
            })?;
        }
        if let Some(s) = submitter {
            let output = request.resolved_output_url();
            if !rhosynth_shared::storage::within(&output, &s.output_root) {
                return Err(Status::permission_denied(format!(
                    "the output location {output} is outside submitter '{}''s output root {}",
                    s.name, s.output_root
                )));
            }
        }
        request.spec.require_input().map_err(|e| Status::invalid_argument(e.to_string()))?;
        if request.spec.evaluation.is_some() && self.config.env.diagnostics_url.is_none() {
            return Err(Status::failed_precondition(
                "the spec asks for an evaluation, but this coordinator has no diagnostics store (serve --diagnostics): \
                 evaluation reports are computed on private data and go to the data owner only",
            ));
        }
        Ok(())
    }

    /// Starts an accepted request on behalf of `submitter` (who alone may see it).
    fn spawn_job(&self, request: JobRequest, submitter: Option<&Submitter>) -> Result<ProgressHandle, Status> {
        let progress: ProgressHandle = Arc::new(Mutex::new(Progress::default()));
        let cancel = Arc::new(Notify::new());
        let job_id = request.job_id.clone();
        match self.jobs.lock().unwrap_or_else(|e| e.into_inner()).entry(job_id.clone()) {
            Entry::Occupied(_) => return Err(Status::already_exists(format!("job {job_id} was already submitted"))),
            Entry::Vacant(slot) => slot.insert(JobEntry {
                progress: progress.clone(),
                outcome: None,
                diagnostics_pending: false,
                submitter: submitter.map(|s| s.name.clone()),
                started: Instant::now(),
                ended: None,
                cancel: cancel.clone(),
            }),
        };
        let this = self.clone();
        let handle = progress.clone();
        tokio::spawn(async move {
            let evaluation = request.spec.evaluation.is_some().then(|| request.clone());
            let result = run_job(request, &this.config.env, &this.scheduler, &this.telemetry, handle, &cancel).await;
            let succeeded = result.is_ok();
            let outcome = match result {
                Ok(manifest) => {
                    tracing::info!(
                        job = job_id,
                        rows = manifest.rows,
                        epsilon = manifest.privacy.epsilon,
                        "job succeeded"
                    );
                    Ok(serde_json::to_string_pretty(&manifest).unwrap_or_default())
                }
                // The operator's log gets the whole error; the submitter what cannot
                // depend on private data.
                Err(e) if e.is_refusal() => {
                    tracing::warn!(job = job_id, error = %e, "job refused by the privacy ledger");
                    Err((JobState::Refused, e.submitter_message()))
                }
                Err(e) => {
                    tracing::error!(job = job_id, error = %e, "job failed");
                    Err((JobState::Failed, e.submitter_message()))
                }
            };
            let evaluate = evaluation.filter(|_| succeeded);
            if let Some(entry) = this.jobs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&job_id) {
                entry.outcome = Some(outcome);
                entry.ended = Some(Instant::now());
                entry.diagnostics_pending = evaluate.is_some();
            }
            // The status is final before the data owner's diagnostics start.
            if let Some(request) = evaluate {
                evaluate_for_owner(&request, &this.config.env).await;
                if let Some(entry) = this.jobs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&job_id) {
                    entry.diagnostics_pending = false;
                }
            }
        });
        Ok(progress)
    }

    /// Cancels a running job: it stops with nothing released unless its release has begun,
    /// which then runs to its end. An unknown job is nothing to cancel.
    pub fn cancel_job(&self, job_id: &str) {
        if let Some(entry) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(job_id) {
            entry.cancel.notify_one();
        }
    }

    /// One Prometheus scrape: jobs by state, workers, tasks, ε per dataset.
    pub fn metrics(&self) -> String {
        let mut e = Exposition::default();
        let mut states: BTreeMap<&str, f64> =
            ["running", "succeeded", "failed", "refused"].into_iter().map(|s| (s, 0.0)).collect();
        for entry in self.jobs.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let state = match &entry.outcome {
                None => "running",
                Some(Ok(_)) => "succeeded",
                Some(Err((JobState::Refused, _))) => "refused",
                Some(Err(_)) => "failed",
            };
            *states.entry(state).or_default() += 1.0;
        }
        for (state, n) in states {
            e.gauge("rhosynth_jobs", "Jobs known to this coordinator, by state.", &[("state", state)], n);
        }
        e.gauge("rhosynth_workers", "Live workers.", &[], self.scheduler.live_workers().len() as f64);
        self.telemetry.render(&mut e);
        e.finish()
    }

    /// Whether an ended job's evaluation report is still being written (a standalone `run`
    /// waits for it before exiting).
    pub fn diagnostics_pending(&self, job_id: &str) -> bool {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(job_id).is_some_and(|e| e.diagnostics_pending)
    }

    /// Status of a job (what `GetJob` returns).
    pub fn job_status(&self, job_id: &str) -> Option<JobStatus> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let entry = jobs.get(job_id)?;
        let p = entry.progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut status = JobStatus {
            job_id: job_id.to_string(),
            state: JobState::Running as i32,
            message: p.stage.clone(),
            tasks_total: p.tasks_total,
            tasks_done: p.tasks_done,
            epsilon_spent: p.epsilon_spent,
            manifest_json: String::new(),
        };
        match &entry.outcome {
            None => {}
            Some(Ok(manifest)) => {
                status.state = JobState::Succeeded as i32;
                status.manifest_json = manifest.clone();
            }
            Some(Err((state, message))) => {
                status.state = *state as i32;
                status.message = message.clone();
            }
        }
        Some(status)
    }

    /// What a submitter sees of a job (`GetJob`). With a release quantum (a coordinator
    /// serving declared datasets) a job is only "running" — no stage, task count or ε —
    /// until the first boundary of its schedule after it ended: what changes before depends
    /// on public parameters alone. Stages and progress stay in the operator's log and
    /// metrics; `job_status` is the in-process (data owner's) view.
    pub fn submitter_status(&self, job_id: &str) -> Option<JobStatus> {
        let Some(quantum) = self.config.env.release_quantum else { return self.job_status(job_id) };
        let visible = {
            let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let entry = jobs.get(job_id)?;
            let schedule = Schedule { started: entry.started, quantum };
            entry.ended.is_some_and(|ended| Instant::now() >= schedule.boundary_after(ended))
        };
        if visible {
            return self.job_status(job_id);
        }
        Some(JobStatus {
            job_id: job_id.to_string(),
            state: JobState::Running as i32,
            message: SCHEDULED.into(),
            ..Default::default()
        })
    }
}

/// A served job's status until its end is shown.
pub const SCHEDULED: &str = "running (its end is shown at a boundary of its schedule)";

fn invalid(e: ResultError) -> Status {
    Status::invalid_argument(e.to_string())
}

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        self.config.access.worker(&request)?;
        let r = request.into_inner();
        if r.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "incompatible rhosynth protocol: worker '{}' ({}) speaks version {}, this coordinator ({}) speaks {}",
                r.worker_name,
                r.rhosynth_version,
                r.protocol_version,
                env!("CARGO_PKG_VERSION"),
                PROTOCOL_VERSION
            )));
        }
        let worker_id = self.scheduler.register(&r.worker_name, r.capabilities.unwrap_or_default());
        Ok(Response::new(RegisterWorkerResponse {
            worker_id,
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u32,
        }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        self.config.access.worker(&request)?;
        let known = self.scheduler.heartbeat(&request.into_inner().worker_id);
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn poll_task(&self, request: Request<PollTaskRequest>) -> Result<Response<PollTaskResponse>, Status> {
        self.config.access.worker(&request)?;
        let PollTaskRequest { worker_id: worker, wait_ms } = request.into_inner();
        if !self.scheduler.heartbeat(&worker) {
            return Err(Status::not_found(format!("unknown worker {worker}: register again")));
        }
        // Capped well below the worker timeout so a held poll never looks like silence.
        let wait = Duration::from_millis(u64::from(wait_ms)).min(self.config.worker_timeout / 2);
        let task = self.scheduler.poll_wait(&worker, wait).await.map(|(def, attempt)| Task {
            job_id: def.job_id,
            task_id: def.task_id,
            attempt,
            partition_urls: def.partition_urls,
            work: Some(def.work.as_ref().clone()),
        });
        Ok(Response::new(PollTaskResponse { task }))
    }

    async fn submit_result(
        &self,
        request: Request<Streaming<ResultChunk>>,
    ) -> Result<Response<SubmitResultResponse>, Status> {
        self.config.access.worker(&request)?;
        let mut stream = request.into_inner();
        let header = match stream.next().await {
            Some(Ok(ResultChunk { part: Some(Part::Header(h)) })) => h,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Status::invalid_argument("a result stream must start with its header"));
            }
        };
        // Nothing is buffered for a result no running attempt waits for.
        if !self.scheduler.is_running(&header.worker_id, &header.job_id, header.task_id, header.attempt) {
            return Err(Status::failed_precondition(format!(
                "task {} attempt {} of job {} is not running on {}",
                header.task_id, header.attempt, header.job_id, header.worker_id
            )));
        }
        let mut result = ResultStream::new(header).map_err(invalid)?;
        while let Some(chunk) = stream.next().await {
            match chunk?.part {
                Some(Part::Data(d)) => result.push(d).map_err(invalid)?,
                _ => {
                    return Err(Status::invalid_argument("a second header in one result stream"));
                }
            }
        }
        let (job_id, attempt) = (result.header().job_id.clone(), result.header().attempt);
        let result = result.finish().map_err(invalid)?;
        self.scheduler.complete(&job_id, attempt, result).map_err(Status::failed_precondition)?;
        Ok(Response::new(SubmitResultResponse {}))
    }

    async fn report_failure(
        &self,
        request: Request<ReportFailureRequest>,
    ) -> Result<Response<ReportFailureResponse>, Status> {
        self.config.access.worker(&request)?;
        let r = request.into_inner();
        self.scheduler
            .fail((&r.worker_id, &r.job_id, r.task_id, r.attempt), r.error, r.input_mismatch)
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(ReportFailureResponse {}))
    }

    async fn submit_job(&self, request: Request<SubmitJobRequest>) -> Result<Response<SubmitJobResponse>, Status> {
        let submitter = self.config.access.submitter(&request)?.cloned();
        let r = request.into_inner();
        let spec = JobSpec::parse(&r.spec_toml, &r.spec_path).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut job_id = spec.job.id.clone().unwrap_or_else(new_job_id);
        // A submitter's job ids live in its own namespace, so no one can resubmit (and so
        // resume and receive) another submitter's charged run.
        if let Some(s) = &submitter {
            job_id = format!("{}.{job_id}", s.name);
        }
        let mut request =
            JobRequest { output_url: r.output_url, ledger_url: r.ledger_url, ..JobRequest::new(job_id.clone(), spec) };
        self.accept(&mut request, submitter.as_ref())?;
        // Planning can take a while (PATE searches its accountant): off the async threads.
        let request = tokio::task::spawn_blocking(move || check_generator(&request).map(|()| request))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        self.spawn_job(request, submitter.as_ref())?;
        Ok(Response::new(SubmitJobResponse { job_id }))
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<JobStatus>, Status> {
        let submitter = self.config.access.submitter(&request)?.map(|s| s.name.clone());
        let id = request.into_inner().job_id;
        // Another submitter's job is reported as absent, not as forbidden.
        let owned =
            self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(&id).is_some_and(|e| e.submitter == submitter);
        let status = if owned { self.submitter_status(&id) } else { None };
        status.map(Response::new).ok_or_else(|| Status::not_found(format!("no job {id}")))
    }

    async fn get_ledger(&self, request: Request<GetLedgerRequest>) -> Result<Response<LedgerSummary>, Status> {
        let submitter = self.config.access.submitter(&request)?.cloned();
        let Some(datasets) = &self.config.datasets else {
            return Err(Status::failed_precondition(
                "this coordinator declares no datasets: the data owner reads a ledger with `rhosynth ledger show --store`",
            ));
        };
        let dataset = request.into_inner().dataset_id;
        // A dataset not granted is reported as absent, as another submitter's job is.
        let absent = || Status::not_found(format!("no dataset '{dataset}' is granted to this submitter"));
        if rhosynth_shared::spec::validate_id("dataset id", &dataset).is_err() {
            return Err(Status::not_found("no such dataset is granted to this submitter"));
        }
        if submitter.as_ref().is_some_and(|s| !s.datasets.contains(&dataset)) {
            return Err(absent());
        }
        let url = datasets.ledger_of(&dataset).ok_or_else(absent)?;
        // The store's own error names the operator's locations: for the operator's log.
        let unreadable = |e: &dyn std::fmt::Display| {
            tracing::error!(dataset = %dataset, error = %e, "a submitter's ledger request failed");
            Status::unavailable(format!(
                "the ledger of dataset '{dataset}' cannot be read now; the operator's log says why"
            ))
        };
        let cached = self.ledgers.lock().unwrap_or_else(|e| e.into_inner()).get(&dataset).cloned();
        let handle = match cached {
            Some(handle) => handle,
            None => {
                let location = rhosynth_shared::storage::open(&url).map_err(|e| unreadable(&e))?;
                let ledger = match Ledger::open(&location, &dataset).await {
                    Err(LedgerError::NotInitialised { .. }) => return Err(absent()),
                    opened => opened.map_err(|e| unreadable(&e))?,
                };
                let mut ledgers = self.ledgers.lock().unwrap_or_else(|e| e.into_inner());
                ledgers.entry(dataset.clone()).or_insert_with(|| Arc::new(tokio::sync::Mutex::new(ledger))).clone()
            }
        };
        // One reader of a dataset's ledger at a time: a call reads the entries written since
        // the last (one LIST, a GET each) and composes only their charges.
        let mut ledger = handle.lock_owned().await;
        ledger.refresh().await.map_err(|e| unreadable(&e))?;
        // A submitter's job ids are `<name>.<job id>` (a name holds no dot).
        let own = submitter.map(|s| format!("{}.", s.name));
        // Composing charges under PLD can take a while: off the async threads.
        let shown = tokio::task::spawn_blocking(move || {
            let own = |job: &str| own.as_ref().is_none_or(|prefix| job.starts_with(prefix));
            summary::LedgerSummary::of(&ledger, summary::Reader::Submitter { own: &own })
        })
        .await
        .map_err(|_| Status::internal("the ledger's summary failed"))?
        .map_err(|e| unreadable(&e))?;
        let summary_json = serde_json::to_string(&shown).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(LedgerSummary { summary_json }))
    }
}
/// Plans the request's generator from public information, so that bad parameters are
/// refused at submission rather than when the job runs.
fn check_generator(request: &JobRequest) -> Result<(), Status> {
    let domain = rhosynth_shared::data::domain::Domain::from_spec(&request.spec);
    rhosynth_shared::generators::check(&request.spec, &domain).map_err(|e| Status::invalid_argument(e.to_string()))
}
