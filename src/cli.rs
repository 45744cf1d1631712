//! The `lode` command line (clap derive). Parsing only: `lib.rs` does the work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "lode",
    version,
    about = "Decouple the input pipeline of TensorFlow training graphs onto elastic data workers"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); also LODE_LOG / RUST_LOG filters.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors: no logs, and no report of work done (partition, convert, consume, run,
    /// drain, synthetic); commands whose output is the answer (inspect, status, exec, kernels,
    /// simulate, the dispatcher's address, a worker's closing summary) still print it.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what a model holds: format, nodes, ops, functions, variables, input pipeline,
    /// signatures.
    Inspect(InspectArgs),
    /// Write a model's GraphDef as binary (.pb) or text (.pbtxt).
    Convert(ConvertArgs),
    /// Cut a training graph into a training-worker graph and data-worker stage graphs.
    Partition(PartitionArgs),
    /// Run a plan's data-worker stages in-process for a number of steps, in sequential order;
    /// dump the send tensors or report the throughput.
    Exec(ExecArgs),
    /// Serve a job's dispatcher: index batches, leases, the journal.
    Dispatcher(DispatcherArgs),
    /// Run a data worker for a job's dispatcher.
    Worker(WorkerArgs),
    /// Emulate a training worker: receive steps in order at a set step time and log them.
    Consume(ConsumeArgs),
    /// Show a job's state (epoch, watermark, workers, leases).
    Status(StatusArgs),
    /// Scale in: the worker finishes what it holds, gets no new step, then exits.
    Drain(DrainArgs),
    /// Run a whole job on this machine: dispatcher, consumer and worker processes.
    Run(RunArgs),
    /// Train an unmodified TensorFlow program on Lode (TF1 sessions, TF2 and Keras): its graph
    /// is cut when it creates its session (or first runs it once a pipeline appears) or first
    /// iterates a dataset, and data workers feed its training graph. Each dataset a TF2
    /// program iterates (Keras `validation_data`, `evaluate` on another) is a job of its own.
    Train(TrainArgs),
    /// Simulate a GPU cluster's jobs under Lode's schedulers and the paper's baselines.
    Simulate(SimulateArgs),
    /// Write a synthetic one-stage plan whose steps take a fixed time (for benchmarks and
    /// scheduler tests); run it with `lode run PLANDIR` or `lode dispatcher --plan PLANDIR`.
    Synthetic(SyntheticArgs),
    /// Move data workers between running jobs under MaxTP, SRTF or Fair, from each job's
    /// queue metrics, on an interval.
    Scheduler(SchedulerArgs),
    /// Run the Kubernetes controller of LodeJobs; or, without a cluster, print the CRDs
    /// (--print-crd) or the objects a LodeJob would get (--render).
    Controller(ControllerArgs),
    /// List the ops data workers run natively (the kernel registry); a stage node of any other
    /// op stays in training. With --coverage, cut each construct graph and say whether its
    /// whole data side runs natively.
    Kernels(KernelsArgs),
}

/// `lode controller`.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Watch LodeJobs in this namespace only (default: every namespace). Also LODE_NAMESPACE.
    #[arg(long, env = "LODE_NAMESPACE")]
    pub namespace: Option<String>,
    /// The field manager of every server-side apply.
    #[arg(long, default_value = "lode-controller")]
    pub field_manager: String,
    /// How often each job is reconciled again (when its dispatcher's counters are read).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub resync: std::time::Duration,
    /// How long a dispatcher has to answer its Status RPC.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub dispatcher_timeout: std::time::Duration,
    /// The first retry's delay after a failed reconcile (doubled per further failure, at most
    /// 5 minutes).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub backoff: std::time::Duration,
    /// Print the objects the controller would make for the LodeJob in FILE, as YAML, and exit
    /// (a dry run: no cluster is contacted).
    #[arg(long, value_name = "LODEJOB.yaml", conflicts_with = "print_crd")]
    pub render: Option<PathBuf>,
    /// With --render: the dispatcher's status to plan from, JSON with `stages` and optionally
    /// `epoch`, `watermark`, `endOfData`, `stepsConsumed`, `stepsPerEpoch`, `stepsComputed`,
    /// `workersPerStage` (default: no answer yet, so only the Secret and the Service).
    #[arg(long, value_name = "STATUS.json", requires = "render")]
    pub status: Option<PathBuf>,
    /// Print the CRDs (LodeJob, LodePool) as YAML and exit.
    #[arg(long)]
    pub print_crd: bool,
    /// With --render: `text` prints a YAML stream, `json` one JSON array of the objects.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, requires = "render")]
    pub format: OutputFormat,
    // The CA for dispatchers of jobs with spec.tlsSecret (reached over https://).
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct KernelsArgs {
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
    /// Report, per construct graph of DIR (its `constructs.json` and `<name>/model.pb`, as
    /// `fixtures/gen/constructs.py` writes them), whether its whole data side runs natively or
    /// which ops limited the cut and where it then falls. Exit 1 when a construct is neither
    /// native nor a documented exception.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "fixtures/constructs")]
    pub coverage: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SyntheticArgs {
    /// The plan directory to create (must not exist, or be empty).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Time one step's work takes on a data worker.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub latency: std::time::Duration,
    /// Spin on a CPU for the latency instead of sleeping (sleeping models a worker's CPU time
    /// without using this machine's CPUs).
    #[arg(long)]
    pub spin: bool,
    /// Records in one epoch (generated into DIR/data/records.tfrecord).
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Records per step.
    #[arg(long, default_value_t = 32)]
    pub batch: u64,
    /// Values per record in each step's output tensor.
    #[arg(long, default_value_t = 16)]
    pub width: u64,
    /// Passes over the records (the plan's repeat count).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Equal parts a step's work splits into, run in parallel on the worker's threads: a
    /// worker of k threads takes ceil(P/k) × latency / P per step.
    #[arg(long, default_value_t = 1)]
    pub parallelism: u64,
    /// The values: float32 from each record's hash (hardly compressible), or int64 feature
    /// ids hashed into 10,000 buckets (compressible, as parsed categorical features are).
    #[arg(long, value_enum, default_value_t = SyntheticValuesArg::Floats)]
    pub values: SyntheticValuesArg,
}

/// `lode synthetic --values`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyntheticValuesArg {
    Floats,
    Ids,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// Binary GraphDef.
    Pb,
    /// Text GraphDef.
    Pbtxt,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A GraphDef (.pb/.pbtxt), a MetaGraphDef (.meta) or a SavedModel directory.
    pub model: PathBuf,
    /// SavedModel tag set to select, comma-separated (e.g. `serve` or `train,gpu`); needed when
    /// the SavedModel holds several MetaGraphs.
    #[arg(long, value_delimiter = ',', env = "LODE_TAGS")]
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Output encoding.
    #[arg(long, value_enum)]
    pub to: GraphFormat,
    /// Output file; written atomically, never over the input.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The plan directory to create (must not exist, or be empty).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Cut at IteratorGetNext (the tf.data boundary) instead of the maximal stateless region.
    #[arg(long)]
    pub simple: bool,
    /// An op to treat as model state besides VariableV2, Variable and VarHandleOp (repeatable).
    #[arg(long = "stateful-op", value_name = "OP")]
    pub stateful_ops: Vec<String>,
    /// Refuse (exit 1) a plan whose data side holds ops without a data-worker kernel, instead
    /// of keeping those nodes (and what depends on them) in training.
    #[arg(long)]
    pub strict_kernels: bool,
    /// The directory the graph's relative data paths (input files, vocabularies) resolve
    /// against, recorded in plan.json; default: the directory holding the model file (for a
    /// SavedModel directory, the directory holding it).
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,
    /// What to print: a summary (text) or plan.json (json).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// A plan directory written by `lode partition`.
    pub plan: PathBuf,
    /// Run stages 0..=STAGE; STAGE's send tensors are dumped or counted.
    #[arg(long, default_value_t = 0)]
    pub stage: usize,
    /// Steps to run.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// The first step (steps count from 0 across epochs).
    #[arg(long, default_value_t = 0)]
    pub start_step: u64,
    /// Worker threads (rayon); default: one per core.
    #[arg(long, env = "LODE_THREADS")]
    pub threads: Option<usize>,
    /// Write each step's send tensors as binary TensorProtos DIR/step_<s>/<k>.pb.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Where the graph's relative data paths resolve (default: the plan's data_root).
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,
    /// Skip and count corrupt records and malformed lines or examples, as TensorFlow's
    /// `ignore_errors()` does, instead of failing.
    #[arg(long)]
    pub ignore_errors: bool,
    /// Run the steps one after another on one thread and report its CPU a step, doing with
    /// each step's send tensors what a worker does: nothing (none), encode its frame (encode),
    /// or encode and write it to a loopback connection in bursts (loopback). Compares a
    /// worker's stage with its frame's cost, without the rest of a worker.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub transport: Option<TransportArg>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}

/// `lode exec --transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    None,
    Encode,
    Loopback,
}

/// A duration like `10ms`, `1.5s`, `250us` or `0`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10ms or 1.5s"))?;
    let seconds = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (ns, us, ms, s, min)"
            ))
        }
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// A size in bytes like `64MiB`, `512KiB`, `1GiB`, `100B` or `0`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "B"),
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 64MiB or 512KiB"))?;
    let scale: u64 = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (B, KiB, MiB, GiB)"
            ))
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// TLS for a port this command serves: certificate and key together, or neither (plaintext).
#[derive(Debug, Clone, Default, Args)]
pub struct ServerTlsArgs {
    /// Serve TLS only, with this PEM certificate chain (the server's certificate first; its
    /// SANs must cover the address clients dial). Needs --tls-key. Also LODE_TLS_CERT.
    #[arg(long, value_name = "FILE", env = "LODE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert. Also LODE_TLS_KEY.
    #[arg(long, value_name = "FILE", env = "LODE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// TLS for the connections this command opens.
#[derive(Debug, Clone, Default, Args)]
pub struct ClientTlsArgs {
    /// PEM CA certificate(s) that sign the servers' certificates: needed to reach https://
    /// addresses (http:// ones stay plaintext). Also LODE_TLS_CA.
    #[arg(long, value_name = "FILE", env = "LODE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DispatcherArgs {
    /// A plan directory written by `lode partition`.
    #[arg(long)]
    pub plan: PathBuf,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Directory of the journal (created; a restart resumes from it).
    #[arg(long)]
    pub journal: PathBuf,
    /// Rewrite the journal as a snapshot of the state each time it has grown by this much
    /// (a restart then reads the snapshot and what followed it, not the whole job's
    /// history), like 64MiB or 512KiB; 0 never compacts.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub journal_compact: u64,
    /// The job's token (also LODE_TOKEN); generated and printed when absent.
    #[arg(long, env = "LODE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Passes over the data, overriding the pipeline's repeat count.
    #[arg(long)]
    pub epochs: Option<u64>,
    /// The job's id.
    #[arg(long, default_value_t = 1)]
    pub job: u64,
    /// How long a worker may hold a step before it is leased again.
    #[arg(long, default_value_t = 10_000)]
    pub lease_ms: u64,
    /// How often workers heartbeat; one silent for --missed-heartbeats of them is lost and
    /// its steps are leased again.
    #[arg(long, default_value_t = lode_dispatcher::service::DEFAULT_HEARTBEAT_MS)]
    pub heartbeat_ms: u64,
    /// Heartbeat intervals a worker may stay silent before it is declared lost.
    #[arg(long, default_value_t = lode_dispatcher::service::DEFAULT_MISSED_HEARTBEATS)]
    pub missed_heartbeats: u32,
    /// Steps one worker may hold at once (it leases up to half of them in one request).
    #[arg(long, default_value_t = lode_dispatcher::DEFAULT_MAX_LEASES)]
    pub max_leases: u32,
    /// Where the graph's relative data paths resolve (default: the plan's data_root).
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Write the bound address (http://host:port) to this file once listening.
    #[arg(long)]
    pub addr_file: Option<PathBuf>,
    /// Keep serving after the job finished (by default the dispatcher exits once the data
    /// ended and the training side and every worker were told so).
    #[arg(long)]
    pub keep_serving: bool,
    /// Serve Prometheus metrics (GET /metrics) on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    /// With --tls-cert and --metrics: the PEM CA certificate that signed --tls-cert (the
    /// metrics endpoint reads the job's status through the dispatcher's TLS port). Also
    /// LODE_TLS_CA.
    #[arg(long, value_name = "FILE", env = "LODE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The dispatcher, http://host:port (https:// with --tls-ca).
    #[arg(long)]
    pub dispatcher: String,
    /// The job's token (also LODE_TOKEN).
    #[arg(long, env = "LODE_TOKEN", hide_env_values = true)]
    pub token: String,
    #[arg(long, default_value_t = 1)]
    pub job: u64,
    /// Kernel threads.
    #[arg(long, env = "LODE_THREADS")]
    pub threads: Option<usize>,
    /// A fixed stage (default: the dispatcher assigns one).
    #[arg(long)]
    pub stage: Option<u32>,
    /// Name for the dispatcher's log.
    #[arg(long)]
    pub name: Option<String>,
    /// Where the graph's relative data paths resolve (default: the plan's data_root).
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Step-message compression: off, lz4 or auto.
    #[arg(long, default_value = "auto")]
    pub compression: String,
    /// Skip and count corrupt records instead of failing.
    #[arg(long)]
    pub ignore_errors: bool,
    /// Serve the worker's Prometheus metrics (GET /metrics) on this address: steps, the
    /// stage's time, frames and bytes sent, RPCs, and the process's CPU time.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// The dispatcher, http://host:port (https:// with --tls-ca).
    #[arg(long)]
    pub dispatcher: String,
    /// The job's token (also LODE_TOKEN).
    #[arg(long, env = "LODE_TOKEN", hide_env_values = true)]
    pub token: String,
    #[arg(long, default_value_t = 1)]
    pub job: u64,
    /// One JSON line per consumed step: epoch, step, records, digest (appended).
    #[arg(long)]
    pub log: PathBuf,
    /// Time the emulated training step takes (0, as `lode run`'s default: as fast as steps
    /// arrive).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub step_time: std::time::Duration,
    /// Address the receiver serves on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// The address data workers dial for the receiver, `HOST` or `HOST:PORT` (the port
    /// defaults to the one bound). Needed when --listen binds every interface (0.0.0.0 or
    /// [::]); otherwise the bound address is registered.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub advertise: Option<String>,
    /// Stop after this many steps (default: until end of data), and end the job there: the
    /// dispatcher tells every worker end of data (and `lode dispatcher` exits).
    #[arg(long)]
    pub steps: Option<u64>,
    /// With --steps: stop without ending the job (another consumer may take over, resuming
    /// from the watermark).
    #[arg(long, requires = "steps")]
    pub leave_open: bool,
    /// The global step expected next (a restarted training side checks the watermark).
    #[arg(long)]
    pub resume_from: Option<u64>,
    /// Restart from a checkpoint taken before this global step, as a training program restored
    /// from it does: the job's watermark moves to the step before (backwards or forwards), and
    /// the steps from this one on are computed and delivered again.
    #[arg(long, value_name = "STEP", conflicts_with = "resume_from")]
    pub rewind_to: Option<u64>,
    /// Steps the receiver buffers ahead of the next one it delivers, at most.
    #[arg(long, default_value_t = lode_transfer::receiver::DEFAULT_CAPACITY)]
    pub capacity: u64,
    /// About the most bytes of steps the receiver buffers: its window is this over the mean
    /// step's size, within --capacity steps (and at least 8).
    #[arg(long, value_name = "BYTES",
          default_value_t = lode_transfer::receiver::DEFAULT_CAPACITY_BYTES)]
    pub capacity_bytes: u64,
    /// Serve the receiver's Prometheus metrics (GET /metrics) on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    // The receiver serves TLS only, and is registered as https://ADDR.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    // For an https:// dispatcher.
    #[command(flatten)]
    pub tls_client: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The dispatcher, http://host:port (https:// with --tls-ca).
    pub addr: String,
    /// The job's token (also LODE_TOKEN).
    #[arg(long, env = "LODE_TOKEN", hide_env_values = true)]
    pub token: String,
    #[arg(long, default_value_t = 1)]
    pub job: u64,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A model or a plan directory (default: the bundled wide_deep example).
    pub input: Option<PathBuf>,
    /// SavedModel tag set, when the model is a SavedModel.
    #[arg(long, value_delimiter = ',')]
    pub tags: Option<Vec<String>>,
    /// Data-worker processes, at least one per stage of the plan (default: 2, or one per
    /// stage when the plan has more).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Steps to consume.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Passes over the data (default: the pipeline's repeat count).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Emulated training step time.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub step_time: std::time::Duration,
    /// Keep the consumer's log here.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Keep the dispatcher's journal in this directory (created; default: a temporary one,
    /// removed at the end). A journal of an earlier run of the same plan resumes that run.
    #[arg(long, value_name = "DIR")]
    pub journal: Option<PathBuf>,
    /// Compact the dispatcher's journal each time it has grown by this much (see `lode
    /// dispatcher --journal-compact`); 0 never compacts.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub journal_compact: u64,
    /// Announce the job to `lode scheduler --jobs DIR`: write DIR/NAME.json (dispatcher
    /// address, job id and token; readable by this user only) while the job runs.
    #[arg(long, value_name = "DIR")]
    pub announce: Option<PathBuf>,
    /// The job's name in the announcement (default: the input's file name and this process id).
    #[arg(long)]
    pub name: Option<String>,
    // The dispatcher and the consumer's receiver serve TLS with this identity (give all three
    // TLS flags, or none); the workers get --tls-ca.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    #[command(flatten)]
    pub tls_client: ClientTlsArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchedulerBackend {
    /// `lode worker` processes on this machine, for jobs started with `lode run --announce`.
    Local,
    /// The LodeJobs of a Kubernetes cluster: their LodePools' replicas and node affinity.
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Maxtp,
    Srtf,
    Fair,
}

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// The cluster-level allocation policy.
    #[arg(long, value_enum)]
    pub policy: PolicyArg,
    #[arg(long, value_enum, default_value_t = SchedulerBackend::Local)]
    pub backend: SchedulerBackend,
    /// The directory jobs are announced in (`lode run --announce DIR`); read every round.
    /// Local backend only (and needed there).
    #[arg(long, value_name = "DIR", required_if_eq("backend", "local"))]
    pub jobs: Option<PathBuf>,
    /// Kubernetes backend: schedule the LodeJobs of this namespace only (default: every
    /// namespace). Also LODE_NAMESPACE.
    #[arg(long, env = "LODE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Kubernetes backend: only nodes with this label hold data workers (`KEY=VALUE`,
    /// repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub node_selector: Vec<String>,
    /// Kubernetes backend: how long a dispatcher has to answer a Status or Drain RPC.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub dispatcher_timeout: std::time::Duration,
    /// Time between rounds.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub interval: std::time::Duration,
    /// Data workers this machine may run, over all jobs (default: one per core); with --tune,
    /// worker threads.
    #[arg(long)]
    pub max_workers: Option<u32>,
    /// Apply the job-level tuner: size each job's workers (threads, stage by stage) from the
    /// measured speedups of probe workers, and withdraw the scheduler's workers from a job
    /// they do not speed up. Without it every worker the scheduler starts has one thread.
    #[arg(long)]
    pub tune: bool,
    /// Stop after this many rounds (default: until interrupted). Workers the scheduler started
    /// are drained when it stops.
    #[arg(long)]
    pub rounds: Option<u64>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
    // For https:// dispatchers; passed on to the workers the scheduler starts.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The dispatcher, http://host:port (https:// with --tls-ca).
    pub addr: String,
    /// The worker's id (see `lode status`).
    #[arg(long)]
    pub worker: u64,
    /// The job's token (also LODE_TOKEN).
    #[arg(long, env = "LODE_TOKEN", hide_env_values = true)]
    pub token: String,
    #[arg(long, default_value_t = 1)]
    pub job: u64,
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Local data-worker processes of each job (default: one per core); 0: workers come from
    /// elsewhere (`lode worker`s dialing --listen or the --announce file, a LodeJob's pools,
    /// `lode scheduler`; a TF2 program's second dataset is then served only with --announce,
    /// as NAME-job2.json).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Serve the job's dispatcher on ADDR; `0.0.0.0:7070` in a pod, for data workers in other
    /// pods (a later job of the program listens on the same host at a free port). The job's
    /// token is LODE_TOKEN when set (a Kubernetes Secret), else a random one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// The host other machines reach this one by (e.g. the pod IP from the downward API):
    /// the training process's receiver then listens on every interface and registers as
    /// HOST, and --announce publishes the dispatcher as HOST.
    #[arg(long, value_name = "HOST", env = "LODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Threads per local data worker.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Cut at the tf.data boundary (IteratorGetNext) instead of the full stateless region.
    #[arg(long)]
    pub simple: bool,
    /// A program Lode cannot cut is an error (status 2) instead of running unchanged.
    #[arg(long)]
    pub strict: bool,
    /// The job's directory: plan, dispatcher journal, worker logs (default: a temporary one).
    /// A restarted program given the same directory continues the job.
    #[arg(long, value_name = "DIR")]
    pub journal: Option<PathBuf>,
    /// Publish DIR/NAME.json (dispatcher URL, job, token) for workers started elsewhere.
    #[arg(long, value_name = "DIR")]
    pub announce: Option<PathBuf>,
    /// The job's name in --announce (default: train-PID).
    #[arg(long)]
    pub name: Option<String>,
    /// Lease duration of a step, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub lease_ms: u64,
    /// Compact the dispatcher's journal each time it has grown by this much (see `lode
    /// dispatcher --journal-compact`); 0 never compacts.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub journal_compact: u64,
    // TLS on every connection of the job (all three TLS flags, or none): the dispatcher and the
    // training process's receiver serve --tls-cert, workers and the training side trust --tls-ca.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    #[command(flatten)]
    pub tls_client: ClientTlsArgs,
    /// The program and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
}

/// `lode simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Job trace CSV: `job,arrival_s,gpus,steps,model` per line (see scheduler/README.md).
    #[arg(long, conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Seed of a synthetic 8-hour Philly-like trace (the default when no --trace is given).
    #[arg(long)]
    pub synthetic: Option<u64>,
    /// Machines: `[N x] G gpu C cpu [M gb]` groups joined by `+`, e.g. `8x8gpu64cpu` or
    /// `4x8gpu64cpu+2x4gpu96cpu512gb` (memory defaults to 8 GB per CPU). `0gpu` groups are
    /// CPU-only machines (`8x8gpu64cpu+4x0gpu64cpu`): data-worker capacity, never a training
    /// worker's place.
    #[arg(long, default_value = "8x8gpu64cpu")]
    pub cluster: String,
    /// Which scheduler to simulate.
    #[arg(long, value_enum, default_value_t = SimPolicyArg::All)]
    pub policy: SimPolicyArg,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
    /// Allocate data workers by the policy's metric alone, without first bringing every
    /// decoupled job to its measured baseline (the modelling choice "Floors" in
    /// scheduler/README.md; with it off a policy may leave a job with no data workers).
    #[arg(long)]
    pub no_floors: bool,
    /// Directory for utilisation.svg, jobs.csv, summary.json and trace.csv (created if
    /// missing).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimPolicyArg {
    All,
    NoDwTuned,
    NoDwHw,
    FixedDw,
    Maxtp,
    Srtf,
    Fair,
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_units_and_refuse_anything_else() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size(" 64MiB "), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        for bad in ["", "MiB", "1.5MiB", "64MB", "-1", "99999999999GiB"] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
