// Internal: process launch, worker environment and rendezvous (core/src/launch).
// (CIUIC_API: exported for ciuic-run and the tests; not part of the plugin SDK.)
//
// `ciuic-run recipe.toml` is its own launcher. When the process was not started by a launcher
// (no RANK/WORLD_SIZE, SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...) it spawns nproc_per_node workers
// (the same executable and arguments, with a torchrun-compatible environment), supervises them
// and returns the run's exit code. Inside a worker, detect_worker_env() describes the process.
// docs/launch.md is the user-facing description of everything here.
//
// Files: env.cpp (detect_worker_env), store.cpp (connect_store, the rendezvous), store_server.cpp
// (the run's store: server and client, tcp_store.h), spawn.cpp (signals, forking a worker:
// spawn.h), node_watch.cpp (the launchers of several nodes watching each other: node_watch.h),
// supervisor.cpp (launch_and_supervise: the event loop), failure.cpp (FailureNotes), memory.cpp.
#pragma once

#include <ciuic/context.h>
#include <ciuic/export.h>
#include <ciuic/store.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ciuic::launch {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // The launcher already hosts the TCPStore at master_addr:master_port (torchrun's agent store,
  // or ciuic-run's own launcher); otherwise rank 0 hosts it.
  bool store_hosted_by_launcher = false;
  std::string launcher;  // "ciuic", "torchrun", "slurm", "mpirun", or "none" (single process)
  // torchrun's TORCHELASTIC_RESTART_COUNT: keys of a restarted attempt are kept apart from those
  // of earlier attempts in the agent's (long-lived) store.
  int restart_count = 0;
  // The run's store token (CIUIC_STORE_TOKEN, else the contents of the file CIUIC_STORE_TOKEN_FILE,
  // trailing white space removed; "" when neither is set). ciuic-run's launcher always sets it; a
  // store that rank 0 hosts for several nodes requires it.
  std::string store_token;
};

// Reads an environment variable: nullptr when unset. The default reads the process environment.
using EnvLookup = std::function<const char*(const char* name)>;

// The worker environment of this process, or nullopt when no launcher started it, checked in this
// order (the first that matches wins):
//   ciuic      CIUIC_LAUNCHER=1 (set by launch_and_supervise) with the torchrun variables below
//   torchrun   RANK and WORLD_SIZE (also any env:// launcher: DeepSpeed's, Accelerate's, ...):
//              LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (else RANK / LOCAL_WORLD_SIZE),
//              MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT
//   slurm      SLURM_PROCID with SLURM_NTASKS > 1 (srun): SLURM_LOCALID, SLURM_NODEID,
//              SLURM_NNODES, SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE; MASTER_ADDR or the
//              first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST; MASTER_PORT or
//              15000 + (SLURM_JOB_ID % 10000)
//   mpirun     OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI), or PMI_RANK/PMI_SIZE
//              with MPI_LOCALRANKID/MPI_LOCALNRANKS or PMI_LOCAL_RANK/PMI_LOCAL_SIZE (MPICH,
//              Intel MPI), world size > 1; MASTER_ADDR (127.0.0.1 when all ranks are local),
//              MASTER_PORT or 29500
// A SLURM or MPI "world" of one task is not a worker environment (nullopt): ciuic-run is then its
// own launcher inside that task. Side effect, "ciuic" only: stdout becomes line-buffered (it is
// a pipe to the launcher, which would otherwise receive lines late).
// Every launcher: the store token from CIUIC_STORE_TOKEN or CIUIC_STORE_TOKEN_FILE (WorkerEnv).
// Throws UsageError naming the variable when a launcher's variables are incomplete or malformed
// (e.g. RANK set but LOCAL_RANK not, RANK >= WORLD_SIZE, MASTER_ADDR missing on several nodes,
// CIUIC_STORE_TOKEN_FILE unreadable, or readable by others than its owner).
CIUIC_API std::optional<WorkerEnv> detect_worker_env();
CIUIC_API std::optional<WorkerEnv> detect_worker_env(const EnvLookup& getenv);

// The token in the file `path` (trailing white space removed). `what` names the file's role in
// errors ("CIUIC_STORE_TOKEN_FILE"). Throws UsageError naming the file when it cannot be opened, is
// not a regular file (a link is not followed), may be read by others than its owner (mode & 077),
// is larger than 4096 bytes, or is empty.
CIUIC_API std::string read_token_file(const std::string& path, const std::string& what);

// Helpers of detect_worker_env, exposed for tests.
// The first host of a SLURM node list ("gpu[03-05,9],cpu1" -> "gpu03"); nullopt when the
// expression is not one this parser understands.
CIUIC_API std::optional<std::string> first_slurm_host(std::string_view nodelist);
// Tasks on node `node_id` from SLURM's "<count>(x<repeat>),..." form ("4(x2),3" -> 4, 4, 3);
// nullopt when malformed or node_id is out of range.
CIUIC_API std::optional<int> slurm_tasks_on_node(std::string_view tasks_per_node, int node_id);

// Copies the rank layout and rendezvous address of `env` into `ctx` (rank, world_size,
// local_rank, local_world_size, node_rank, num_nodes, master_addr, master_port); leaves the other
// fields alone.
CIUIC_API void apply_worker_env(const WorkerEnv& env, RunContext& ctx);

// Cores this process may run on (its CPU affinity; else the online processors).
CIUIC_API int usable_cores();
// OMP_NUM_THREADS's value as a thread count: its first entry ("8", or "8,2" for nested levels)
// when that is an integer in [1, 65536]; nullopt otherwise (absent, empty, or not a count).
CIUIC_API std::optional<int> parse_omp_num_threads(const char* value);

struct LaunchOptions {
  std::vector<std::string> argv;  // the command line to run in each worker (argv[0] = executable;
                                  // without a '/', it is looked up in PATH)
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: pick a free port (single node only)
  bool output_all_ranks = false;  // prefix and show every rank's output, not only rank 0's
  std::chrono::seconds stop_grace{10};
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(10)};
  // Several nodes: the file, on a filesystem every node sees (ciuic-run: <output_dir>/
  // .ciuic-store-token), through which node 0's launcher hands the run's store token to the
  // others. Unused when CIUIC_STORE_TOKEN or CIUIC_STORE_TOKEN_FILE is set (then every node uses
  // that token).
  std::string store_token_file;
};

// Spawns and supervises the workers of this node; returns the exit code for ciuic-run.
//
// Each worker is a child process in its own process group, with PR_SET_PDEATHSIG(SIGKILL) (it
// dies with the launcher, whatever kills the launcher) and the environment of this process plus
// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, GROUP_WORLD_SIZE,
// ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, CIUIC_LAUNCHER=1, and OMP_NUM_THREADS =
// usable cores / nproc_per_node unless OMP_NUM_THREADS is already set.
// Node 0's launcher hosts the run's store (StoreServer, launch/tcp_store.h: so the store outlives
// any worker); launchers of other nodes connect to it to share failures and completion. One node:
// the store binds 127.0.0.1 and serves loopback only. Several: it binds master_addr, and every
// connection must present the run's token: CIUIC_STORE_TOKEN (or CIUIC_STORE_TOKEN_FILE's) when
// set, else a new random one that node 0 writes (mode 0600) to store_token_file and the other
// nodes read from there. Workers get it as CIUIC_STORE_TOKEN, and MASTER_ADDR is the address
// the store is bound to.
//
// Output: every line a worker writes to stdout/stderr is copied to the same stream of this
// process as "[rank N] <line>" — rank 0's only, unless output_all_ranks — but error lines
// (is_error_line) of every rank are always shown, and when a rank fails, its last 20 lines that
// were not shown yet are printed.
//
// Supervision: when a worker exits non-zero or is killed by a signal, the others get SIGTERM and,
// after stop_grace, SIGKILL — at once, or 2 s later when every failure so far looks like a
// consequence of another (is_secondary_error), so that the worker with the cause can print it.
// The launcher logs "rank R (pid P) exited with code C / was killed by signal S; first error:
// <line>" naming the worker that FailureNotes::pick chooses, and returns C (or 128 + S).
// SIGINT/SIGTERM received by this process are forwarded to the workers (which checkpoint and exit
// with 130); a second one kills them (SIGKILL). Returns 0 when every worker of every node exited
// 0, 130 after an interrupt that the workers honoured. Never returns while a worker is alive;
// never leaves one behind.
//
// Several nodes: every launcher registers in the store and sends a heartbeat every 250 ms (from a
// thread, which does all its store traffic). A node whose worker failed reports it; node 0 chooses
// the run's verdict: a node that has not registered within rendezvous_timeout ("node 1 never
// joined ..."), a node whose heartbeat stopped for 5 s, 2 s once the run is failing ("node 1
// (<host> pid <pid>) was lost ..."), else the first report that is not a consequence (or, after
// 3 s, the first report), once every other node has been heard from since. Every node then stops;
// the one whose failure was chosen returns its worker's code, the others 1, naming the verdict.
// The other nodes take the loss of node 0 (the store stops answering) as the verdict "node 0 ...
// was lost". Node 0 keeps the store up until every node that joined has finished or is lost.
//
// Threading: call from the main thread (PR_SET_PDEATHSIG fires when the forking *thread* exits);
// installs handlers for SIGINT, SIGTERM, SIGCHLD and ignores SIGPIPE while it runs, restoring
// the previous ones before returning. Throws UsageError on invalid options (nproc < 1, node_rank
// out of range, master_port 0 on several nodes) and Error when the store cannot be started or
// reached within rendezvous_timeout, when the run was already stopped (a node joining after the
// verdict), or when a worker cannot be forked (before any worker runs, or after stopping those
// running).
CIUIC_API int launch_and_supervise(const LaunchOptions& options);

// True for a worker output line that the launcher always shows: ciuic error log lines
// ("ciuic[3] error: ...", "ciuic-run: error: ..."), C++ terminate messages ("terminate called
// ...", "  what(): ...").
CIUIC_API bool is_error_line(std::string_view line);

// True for an error that is usually the consequence of another failure rather than its cause: a
// connection to a peer that went away ("Connection reset by peer", "Connection closed by peer",
// "Broken pipe", "Connection refused", NCCL's "remote process exited"), a timeout waiting for one
// ("timed out", "timeout waiting"), a store whose host went away ("could not reach the run's
// store", "lost contact with the run's store"). Case-insensitive.
CIUIC_API bool is_secondary_error(std::string_view line);

// What the launcher says about the failed workers of its node: which one to name and which line
// to quote. Fed with every output line of every worker in the order the launcher reads them and
// with each worker that failed on its own (exited non-zero, or was killed by a signal the launcher
// did not send). Not thread-safe (the launcher's event loop owns it).
class CIUIC_API FailureNotes {
 public:
  void line(int rank, std::string_view line, bool from_stderr);
  void failed(int rank);

  struct Pick {
    int rank = -1;
    // Its first error line (is_error_line; a "terminate called ..." line gets the "what(): ..."
    // line that follows it), else its last stderr line that is not a log line below error level,
    // a LibTorch "[I...]"/"[W...]" line, a progress redraw or a backtrace line; "" when none.
    std::string quote;
    bool error_line = false;  // the quote is an error line
    bool secondary = false;   // is_secondary_error(quote)
  };
  // The failure to name: of the failed ranks, the one whose error came first (its first error
  // line, or its exit when it printed none), passing over those whose error is secondary when
  // another's is not. nullopt when no rank failed.
  std::optional<Pick> pick() const;

 private:
  struct Rank {
    std::string first_error;
    uint64_t first_error_at = 0;  // 0: none yet
    bool awaiting_what = false;   // first_error is "terminate called ..." without its what() yet
    std::string last_plain;
    uint64_t failed_at = 0;  // 0: not failed
  };
  Rank& of(int rank);
  std::vector<std::pair<int, Rank>> ranks_;
  uint64_t seq_ = 0;
};

// Connects this worker to the run's key-value store (a c10d TCPStore client, or the server when
// rank 0 hosts it) and completes the rendezvous: every rank announces itself and waits until all
// world_size ranks have. Single-process runs (world_size 1, no launcher store) get an in-memory
// store. The returned store's keys live under "ciuic/" (plus "attempt_<n>/" on torchrun
// restarts); its timeout is `timeout`.
// Throws Error naming the address, port, rank and timeout when the store cannot be reached, and
// on a rendezvous timeout which ranks joined (with their hosts) and which are missing.
CIUIC_API std::shared_ptr<Store> connect_store(const WorkerEnv& env,
                                               std::chrono::milliseconds timeout);

// Caps this process's CUDA caching allocator on `device_index` at `gib` GiB (0 = no cap) through
// CUDACachingAllocator::setMemoryFraction, so that a run can emulate a smaller card; allocations
// beyond it fail with the allocator's out-of-memory error. Logs the cap. CPU builds: does nothing.
// Throws UsageError when the cap exceeds the device's memory. Call once the device is current.
CIUIC_API void apply_memory_cap(int device_index, double gib);

// The CUDA caching allocator's settings ciuic runs with unless the user chose their own: when
// neither PYTORCH_ALLOC_CONF nor PYTORCH_CUDA_ALLOC_CONF is set, sets PYTORCH_CUDA_ALLOC_CONF to
// kAllocatorDefault in this process's environment (workers inherit it). Expandable segments map
// more memory into one segment instead of caching fixed-size blocks: under a memory cap a run that
// allocates differently sized buffers every micro-batch (gradient buckets, activations, loss
// chunks) otherwise fails with memory reserved but unused (the DeepSeek-7B shape under 24 GiB:
// 19.4 GiB allocated, 24.0 GiB reserved). Call before anything touches CUDA. Returns the
// setting now in force ("" = the allocator's own defaults) for the log.
inline constexpr const char* kAllocatorDefault = "expandable_segments:True";
CIUIC_API std::string apply_allocator_defaults();

// The message for an out-of-memory failure of `rank`: the cap (0 = none), the allocator's peak
// allocated and reserved bytes on the device, the device's total memory, and `detail` (the
// allocator's own message). CPU builds: names the rank and the detail only.
CIUIC_API std::string out_of_memory_message(int rank, int device_index, double cap_gib,
                                            std::string_view detail);

}  // namespace ciuic::launch
