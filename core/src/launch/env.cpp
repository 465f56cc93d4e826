// detect_worker_env(): which launcher started this process, and where this rank sits in the run.
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ciuic/error.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "launch/launch.h"

namespace ciuic::launch {
namespace {

// Strict integer parse of a whole string (no sign for counts, no trailing garbage).
std::optional<long long> parse_int(std::string_view s) {
  long long v = 0;
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

class Vars {
 public:
  Vars(const EnvLookup& getenv, std::string launcher)
      : getenv_(getenv), launcher_(std::move(launcher)) {}

  bool has(const char* name) const { return getenv_(name) != nullptr; }
  std::optional<std::string> str(const char* name) const {
    const char* v = getenv_(name);
    if (!v) return std::nullopt;
    return std::string(v);
  }
  // The first of `names` that is set, parsed as an int; nullopt when none is set.
  std::optional<int> opt_int(std::initializer_list<const char*> names, int min_value) const {
    for (const char* n : names) {
      const char* v = getenv_(n);
      if (!v) continue;
      auto x = parse_int(v);
      if (!x || *x < min_value || *x > 1'000'000'000)
        throw UsageError(launcher_ + " environment: " + n + "=\"" + v +
                         "\" is not an integer >= " + std::to_string(min_value));
      return static_cast<int>(*x);
    }
    return std::nullopt;
  }
  int req_int(std::initializer_list<const char*> names, int min_value,
              const std::string& hint) const {
    if (auto v = opt_int(names, min_value)) return *v;
    std::string list;
    for (const char* n : names) list += (list.empty() ? "" : " or ") + std::string(n);
    throw UsageError(launcher_ + " environment: " + list + " is not set" +
                     (hint.empty() ? "" : " (" + hint + ")"));
  }
  const std::string& launcher() const { return launcher_; }

 private:
  const EnvLookup& getenv_;
  std::string launcher_;
};

void validate(const WorkerEnv& e, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw UsageError(origin + " environment: " + what); };
  if (e.world_size < 1) fail("the world size must be >= 1");
  if (e.rank >= e.world_size)
    fail("rank " + std::to_string(e.rank) + " is not below the world size " +
         std::to_string(e.world_size));
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    fail("the local world size " + std::to_string(e.local_world_size) +
         " is not between 1 and the world size " + std::to_string(e.world_size));
  if (e.local_rank >= e.local_world_size)
    fail("local rank " + std::to_string(e.local_rank) + " is not below the local world size " +
         std::to_string(e.local_world_size));
  if (e.node_rank >= e.num_nodes)
    fail("node rank " + std::to_string(e.node_rank) + " is not below the number of nodes " +
         std::to_string(e.num_nodes));
  if (e.master_port < 0 || e.master_port > 65535)
    fail("master port " + std::to_string(e.master_port) + " is not a TCP port");
  if (e.world_size > 1 && e.master_port == 0) fail("the master port is 0 in a multi-process run");
}

// RANK/WORLD_SIZE/... as torchrun (and ciuic's own launcher) set them.
WorkerEnv from_torchrun_vars(const Vars& v, bool ours) {
  WorkerEnv e;
  e.launcher = ours ? "ciuic" : "torchrun";
  e.rank = v.req_int({"RANK"}, 0, "");
  e.world_size = v.req_int({"WORLD_SIZE"}, 1, "");
  const std::string both = "a torchrun-style launcher must set LOCAL_RANK and LOCAL_WORLD_SIZE";
  e.local_rank = v.req_int({"LOCAL_RANK"}, 0, both);
  e.local_world_size = v.req_int({"LOCAL_WORLD_SIZE"}, 1, both);
  e.node_rank = v.opt_int({"GROUP_RANK", "NODE_RANK"}, 0).value_or(e.rank / e.local_world_size);
  e.num_nodes = v.opt_int({"GROUP_WORLD_SIZE"}, 1)
                    .value_or((e.world_size + e.local_world_size - 1) / e.local_world_size);
  if (auto a = v.str("MASTER_ADDR"); a && !a->empty()) {
    e.master_addr = *a;
  } else if (e.world_size > 1) {
    throw UsageError(e.launcher +
                     " environment: MASTER_ADDR is not set (the address of the "
                     "rendezvous store, e.g. 127.0.0.1 on one machine)");
  }
  if (e.world_size > 1)
    e.master_port = v.req_int({"MASTER_PORT"}, 1, "the TCP port of the rendezvous store");
  else
    e.master_port = v.opt_int({"MASTER_PORT"}, 0).value_or(0);
  if (ours) {
    e.store_hosted_by_launcher = true;
  } else {
    auto agent = v.str("TORCHELASTIC_USE_AGENT_STORE");
    e.store_hosted_by_launcher = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    e.restart_count = v.opt_int({"TORCHELASTIC_RESTART_COUNT"}, 0).value_or(0);
  }
  validate(e, e.launcher);
  return e;
}

std::optional<WorkerEnv> from_slurm(const Vars& v) {
  int ntasks = v.req_int({"SLURM_NTASKS", "SLURM_NPROCS"}, 1, "srun sets it with SLURM_PROCID");
  if (ntasks <= 1) return std::nullopt;
  WorkerEnv e;
  e.launcher = "slurm";
  e.world_size = ntasks;
  e.rank = v.req_int({"SLURM_PROCID"}, 0, "");
  e.local_rank = v.req_int({"SLURM_LOCALID"}, 0, "srun sets it");
  e.node_rank = v.req_int({"SLURM_NODEID"}, 0, "srun sets it");
  e.num_nodes =
      v.opt_int({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1).value_or(1);
  std::optional<int> local;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto tpn = v.str(name)) {
      local = slurm_tasks_on_node(*tpn, e.node_rank);
      if (!local)
        throw UsageError("slurm environment: " + std::string(name) + "=\"" + *tpn +
                         "\" does not give a task count for node " + std::to_string(e.node_rank));
      break;
    }
  }
  e.local_world_size = local ? *local : (ntasks + e.num_nodes - 1) / e.num_nodes;
  if (auto a = v.str("MASTER_ADDR"); a && !a->empty()) {
    e.master_addr = *a;
  } else if (e.num_nodes == 1) {
    e.master_addr = "127.0.0.1";
  } else {
    std::optional<std::string> host;
    std::string from;
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = v.str(name)) {
        host = first_slurm_host(*list);
        from = std::string(name) + "=\"" + *list + "\"";
        break;
      }
    }
    if (!host)
      throw UsageError(
          "slurm environment: MASTER_ADDR is not set and the first host could not be read from " +
          (from.empty() ? std::string("SLURM_JOB_NODELIST (unset)") : from) +
          "; set it in the job script: "
          "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)");
    e.master_addr = *host;
  }
  if (auto p = v.opt_int({"MASTER_PORT"}, 1)) {
    e.master_port = *p;
  } else if (auto job = v.opt_int({"SLURM_JOB_ID", "SLURM_JOBID"}, 0)) {
    e.master_port = 15000 + *job % 10000;  // the same for every task of the job
  } else {
    e.master_port = 29500;
  }
  validate(e, "slurm");
  return e;
}

std::optional<WorkerEnv> from_mpi(const Vars& v, bool openmpi) {
  WorkerEnv e;
  e.launcher = "mpirun";
  const std::string origin = openmpi ? "Open MPI" : "PMI";
  if (openmpi) {
    e.rank = v.req_int({"OMPI_COMM_WORLD_RANK"}, 0, "");
    e.world_size = v.req_int({"OMPI_COMM_WORLD_SIZE"}, 1, "mpirun sets it");
    if (e.world_size <= 1) return std::nullopt;
    e.local_rank = v.req_int({"OMPI_COMM_WORLD_LOCAL_RANK"}, 0, "mpirun sets it");
    e.local_world_size = v.req_int({"OMPI_COMM_WORLD_LOCAL_SIZE"}, 1, "mpirun sets it");
  } else {
    e.rank = v.req_int({"PMI_RANK"}, 0, "");
    e.world_size = v.req_int({"PMI_SIZE"}, 1, "the process manager sets it with PMI_RANK");
    if (e.world_size <= 1) return std::nullopt;
    const std::string hint =
        "needed to place ranks on GPUs; Hydra (MPICH, Intel MPI) sets MPI_LOCALRANKID and "
        "MPI_LOCALNRANKS";
    e.local_rank = v.req_int({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, 0, hint);
    e.local_world_size = v.req_int({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, 1, hint);
  }
  // mpirun's default mapping (by slot) places consecutive ranks on the same node.
  e.node_rank = e.rank / e.local_world_size;
  e.num_nodes = (e.world_size + e.local_world_size - 1) / e.local_world_size;
  if (auto a = v.str("MASTER_ADDR"); a && !a->empty()) {
    e.master_addr = *a;
  } else if (e.num_nodes == 1) {
    e.master_addr = "127.0.0.1";
  } else {
    throw UsageError(origin +
                     " environment: MASTER_ADDR is not set; on several nodes it must name "
                     "the host of rank 0 (mpirun -x MASTER_ADDR=<host> ...)");
  }
  e.master_port = v.opt_int({"MASTER_PORT"}, 1).value_or(29500);
  validate(e, origin);
  return e;
}

std::optional<WorkerEnv> detect_launcher_env(const EnvLookup& getenv) {
  auto ours = getenv("CIUIC_LAUNCHER");
  if (ours && std::string_view(ours) == "1") return from_torchrun_vars(Vars(getenv, "ciuic"), true);
  if (getenv("RANK") && getenv("WORLD_SIZE"))
    return from_torchrun_vars(Vars(getenv, "torchrun"), false);
  if (getenv("SLURM_PROCID")) return from_slurm(Vars(getenv, "slurm"));
  if (getenv("OMPI_COMM_WORLD_RANK")) return from_mpi(Vars(getenv, "Open MPI"), true);
  if (getenv("PMI_RANK")) return from_mpi(Vars(getenv, "PMI"), false);
  return std::nullopt;
}

}  // namespace

std::string read_token_file(const std::string& path, const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) throw UsageError(what + " " + path + " cannot be opened: " + std::strerror(errno));
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0)
    why = std::strerror(errno);
  else if (!S_ISREG(st.st_mode))
    why = "it is not a regular file";
  else if (st.st_mode & 077)
    why = "others than its owner may read it (chmod 600 it)";
  else if (st.st_size > 4096)
    why = "it is larger than 4096 bytes";
  std::string t;
  if (why.empty()) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 && t.size() < 4096)
      t.append(buf, static_cast<size_t>(n));
    if (n < 0) why = std::strerror(errno);
  }
  close(fd);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (why.empty() && t.empty()) why = "it is empty";
  if (!why.empty()) throw UsageError(what + " " + path + " cannot be used: " + why);
  return t;
}

namespace {

std::string token_of(const EnvLookup& getenv) {
  if (const char* t = getenv("CIUIC_STORE_TOKEN"); t && *t) return t;
  if (const char* f = getenv("CIUIC_STORE_TOKEN_FILE"); f && *f)
    return read_token_file(f, "CIUIC_STORE_TOKEN_FILE");
  return "";
}

}  // namespace

std::optional<WorkerEnv> detect_worker_env(const EnvLookup& getenv) {
  auto env = detect_launcher_env(getenv);
  if (env) env->store_token = token_of(getenv);
  return env;
}

std::optional<WorkerEnv> detect_worker_env() {
  auto env = detect_worker_env([](const char* name) { return std::getenv(name); });
  if (env && env->launcher == "ciuic") setvbuf(stdout, nullptr, _IOLBF, 0);
  return env;
}

void apply_worker_env(const WorkerEnv& env, RunContext& ctx) {
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  ctx.local_rank = env.local_rank;
  ctx.local_world_size = env.local_world_size;
  ctx.node_rank = env.node_rank;
  ctx.num_nodes = env.num_nodes;
  ctx.master_addr = env.master_addr;
  ctx.master_port = env.master_port;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::optional<int> parse_omp_num_threads(const char* value) {
  if (!value) return std::nullopt;
  std::string_view v(value);
  v = v.substr(0, v.find(','));
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty() || v.size() > 5) return std::nullopt;
  int n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n < 1 || n > 65536) return std::nullopt;
  return n;
}

std::optional<std::string> first_slurm_host(std::string_view list) {
  // The first comma-separated item at bracket depth 0: "prefix[ranges]suffix" or a plain name.
  size_t end = 0;
  int depth = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[')
      ++depth;
    else if (list[end] == ']')
      --depth;
    else if (list[end] == ',' && depth == 0)
      break;
    if (depth < 0 || depth > 1) return std::nullopt;
  }
  if (depth != 0) return std::nullopt;
  std::string_view item = list.substr(0, end);
  if (item.empty()) return std::nullopt;
  size_t open = item.find('[');
  if (open == std::string_view::npos) {
    if (item.find(']') != std::string_view::npos) return std::nullopt;
    return std::string(item);
  }
  size_t close = item.find(']', open);
  std::string_view suffix = item.substr(close + 1);
  if (suffix.find('[') != std::string_view::npos) return std::nullopt;  // two bracket groups
  std::string_view ranges = item.substr(open + 1, close - open - 1);
  std::string_view first = ranges.substr(0, std::min(ranges.find(','), ranges.find('-')));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  return std::string(item.substr(0, open)) + std::string(first) + std::string(suffix);
}

std::optional<int> slurm_tasks_on_node(std::string_view spec, int node_id) {
  if (node_id < 0) return std::nullopt;
  size_t pos = 0;
  long long node = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string_view item =
        spec.substr(pos, comma == std::string_view::npos ? spec.size() - pos : comma - pos);
    long long repeat = 1;
    size_t paren = item.find('(');
    std::string_view count_s = item.substr(0, paren);
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')')
        return std::nullopt;
      auto r = parse_int(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1) return std::nullopt;
      repeat = *r;
    }
    auto count = parse_int(count_s);
    if (!count || *count < 1) return std::nullopt;
    if (node_id < node + repeat) return static_cast<int>(*count);
    node += repeat;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return std::nullopt;
}

}  // namespace ciuic::launch
