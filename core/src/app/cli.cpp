// The flow of `ciuic-run`; see cli.h.
#include "app/cli.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

#include <ciuic/comm.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/log.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/version.h>

#include "base/paths.h"
#include "base/text.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/run_dir.h"
#include "import/deepspeed.h"
#include "import/training_file.h"
#include "launch/launch.h"
#include "model/hf_export.h"
#include "model/llama.h"
#include "model/lora.h"
#include "plan/plan.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"
#include "registry/registry.h"
#include "report/html_report.h"
#include "report/watch.h"
#include "sdk/printable.h"
#include "tokenizer/factory.h"
#include "train/evaluate.h"
#include "train/options.h"
#include "train/run.h"
#include "train/worker.h"

namespace ciuic::app {

namespace fs = std::filesystem;

std::vector<std::string> effective_overrides(const CliOptions& o) {
  std::vector<std::string> out = o.overrides;
  if (o.nproc) out.push_back("cluster.nproc_per_node=" + std::to_string(*o.nproc));
  if (o.nnodes) out.push_back("cluster.nnodes=" + std::to_string(*o.nnodes));
  if (o.output_all_ranks) out.push_back("cluster.output=\"all\"");
  return out;
}

std::vector<std::string> plugin_paths(const CliOptions& o, const Recipe* recipe) {
  std::vector<std::string> out = o.plugin_paths;
  if (recipe) {
    for (const auto& p : recipe->section("run").get_string_list("plugin_paths")) {
      fs::path path(p);
      out.push_back(
          path.is_absolute() ? p : (fs::path(recipe->dir()) / path).lexically_normal().string());
    }
  }
  return out;
}

namespace {

void apply_log_level(const Recipe& recipe) {
  const std::string level = recipe.section("run").get_string("log_level");
  if (level == "debug")
    set_log_level(LogLevel::kDebug);
  else if (level == "warning")
    set_log_level(LogLevel::kWarn);
  else if (level == "error")
    set_log_level(LogLevel::kError);
  else
    set_log_level(LogLevel::kInfo);
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.resize(n, ' ');
  return s;
}

// A temporary folder removed when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ciuic-dry-run-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw Error("cannot create a temporary folder for the dry run under " +
                  fs::temp_directory_path().string());
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    remove_tree(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int dry_run(const Recipe& recipe, const Registry& registry, const std::string& resume) {
  const Config cluster = recipe.section("cluster");
  const Config run = recipe.section("run");
  TempDir out_dir;
  RunContext ctx;
  ctx.device =
      cluster.get_string("device") == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  ctx.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(cluster.get_float("timeout_s") * 1000));
  launch::WorkerEnv env;
  env.launcher = "none";
  ctx.store = launch::connect_store(env, ctx.timeout);
  ctx.run_name = run.get_string("name");
  ctx.output_dir = out_dir.path();
  ctx.recipe_dir = recipe.dir();
  ctx.seed = static_cast<uint64_t>(run.get_int("seed"));
  ctx.cpu_threads = std::max(1u, std::thread::hardware_concurrency());
  // The data source is opened as rank 0 of the recipe's world (the other plugins see a world of
  // one).
  RunContext data_ctx = ctx;
  data_ctx.world_size =
      static_cast<int>(cluster.get_int("nnodes") * cluster.get_int("nproc_per_node"));

  std::ostringstream os;
  os << "dry run of " << (recipe.path().empty() ? "<recipe>" : recipe.path()) << ": "
     << cluster.get_int("nnodes") << " node(s) x " << cluster.get_int("nproc_per_node")
     << " process(es), device " << cluster.get_string("device") << ", "
     << recipe.section("train").get_int("max_steps") << " steps\n";
  // Created in slot order (comm first), destroyed in reverse order.
  std::vector<std::shared_ptr<PluginObject>> objects;
  std::optional<std::vector<plan::PlannedOption>> planned;  // chosen on first need
  for (int i = 0; i < kNumSlots; ++i) {
    const Slot slot = static_cast<Slot>(i);
    const std::string name = recipe.plugin_name(slot);
    os << "  " << pad(slot_name(slot), 10);
    if (!registry.find(slot, name) && ctx.device.is_cuda() && !at::hasCUDA()) {
      // A GPU recipe checked on a CPU-only build: its CUDA plugins were not built; the rest is
      // still checked.
      os << pad(name, 12)
         << "not in this build (built without CUDA: CIUIC_WITH_CUDA=OFF); not checked\n";
      objects.push_back(nullptr);
      continue;
    }
    const PluginDescriptor& d = registry.get(slot, name);
    Config config = recipe.plugin_config(slot, *d.info);
    // Options the memory planner chooses (kOptionPlanned, "auto"), as a worker would: against the
    // cap, else a CPU worker's share of this machine; a GPU without a cap: the last choice (the
    // worker chooses from its device's memory).
    std::string chosen;
    if (plan::has_planned_auto(config, *d.info)) {
      if (!planned) {
        double whole = cluster.get_float("memory_per_device_gib") * 1073741824.0;
        const bool host_share = whole <= 0 && !ctx.device.is_cuda();
        if (host_share)
          whole = plan::physical_memory() /
                  static_cast<double>(std::max<int64_t>(1, cluster.get_int("nproc_per_node")));
        planned = plan::planned_options(recipe, registry,
                                        plan::auto_budget_bytes(whole, /*dedicated=*/!host_share));
      }
      config = plan::with_planned(config, slot, *planned);
      for (const plan::PlannedOption& o : *planned)
        if (o.slot == slot)
          chosen += std::string(chosen.empty() ? "" : ", ") + o.key + " = " +
                    (o.integer ? o.value : "\"" + o.value + "\"");
    }
    switch (slot) {
      case Slot::kComm: objects.push_back(registry.create<Comm>(slot, name, config, ctx)); break;
      case Slot::kSharding:
        objects.push_back(registry.create<Sharding>(slot, name, config, ctx));
        break;
      case Slot::kOptimizer:
        objects.push_back(registry.create<Optimizer>(slot, name, config, ctx));
        break;
      case Slot::kPrecision:
        objects.push_back(registry.create<Precision>(slot, name, config, ctx));
        break;
      case Slot::kData:
        objects.push_back(registry.create<DataSource>(slot, name, config, data_ctx));
        break;
    }
    os << pad(d.name, 12) << pad(d.version, 9) << "created  " << d.path
       << (chosen.empty() ? "" : " (auto: " + chosen + ")") << "\n";
  }
  // The plugins compose as a worker requires (train/run.h).
  {
    auto* sharding = dynamic_cast<Sharding*>(objects[static_cast<size_t>(Slot::kSharding)].get());
    auto* optimizer =
        dynamic_cast<Optimizer*>(objects[static_cast<size_t>(Slot::kOptimizer)].get());
    auto* precision =
        dynamic_cast<Precision*>(objects[static_cast<size_t>(Slot::kPrecision)].get());
    if (sharding && optimizer && precision)
      train::check_sharded_parameters(recipe, registry, *sharding, *optimizer, *precision);
  }
  // Preflight: every input the run reads, opened as the run opens it; nothing is trained.
  const train::TrainOptions opt = train::TrainOptions::from(recipe);
  const model::LlamaConfig cfg =
      train::recipe_model_config(recipe);  // reads [model] path's config.json
  if (!opt.model_path.empty()) {
    const fs::path p(opt.model_path);
    if (!paths::is((p / "model.safetensors").string(), paths::Want::kAny) &&
        !paths::is((p / "model.safetensors.index.json").string(), paths::Want::kAny))
      throw UsageError("[model] path " + opt.model_path +
                       ": no model.safetensors or model.safetensors.index.json (expected a Hugging "
                       "Face model folder)");
  }
  os << "  model      " << (opt.model_path.empty() ? std::string("random init") : opt.model_path)
     << ", " << cfg.num_parameters() << " parameters\n";
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  if (!opt.tokenizer_path.empty()) {
    tokenizer = load_tokenizer(opt.tokenizer_path);
    chat_template = make_chat_template(opt.chat_template, *tokenizer);
    if (tokenizer->vocab_size() > cfg.vocab_size)
      throw UsageError("tokenizer " + opt.tokenizer_path + " has " +
                       std::to_string(tokenizer->vocab_size()) +
                       " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size));
    os << "  tokenizer  " << opt.tokenizer_path << ", " << tokenizer->vocab_size()
       << " tokens, chat template " << opt.chat_template << "\n";
  }
  if (auto* data = dynamic_cast<DataSource*>(objects[static_cast<size_t>(Slot::kData)].get())) {
    DataOpenArgs da;
    da.seq_len = opt.seq_len;
    da.micro_batch_size = opt.micro_batch;
    da.tokenizer = tokenizer.get();
    da.chat_template = chat_template.get();
    train::open_data_plugin(recipe, registry, *data, da);
    os << "  data       opened as rank 0 of " << data_ctx.world_size << "\n";
  }
  // As the run's Evaluator loads them after the data, as the run does (a run met a bad file only
  // after its set-up).
  if (const auto questions = train::load_exact_match_questions(opt, tokenizer && chat_template);
      !questions.empty())
    os << "  exact match " << opt.exact_match_file << ", " << questions.size() << " question(s)\n";
  if (!resume.empty()) {
    std::string folder;
    if (resume != "auto")
      folder = checkpoint::resolve(resume, opt.checkpoint_dir);
    else
      try {
        folder = checkpoint::resolve("latest", opt.checkpoint_dir);
      } catch (const UsageError&) {  // --resume auto without a checkpoint: a fresh start
      }
    if (!folder.empty()) checkpoint::verify(folder, /*checksums=*/false);
    os << "  resume     "
       << (folder.empty() ? "auto: no checkpoint yet, a fresh start"
                          : folder + " (manifest and sizes checked)")
       << "\n";
  }
  while (!objects.empty()) objects.pop_back();
  os << "the recipe, its plugins and its inputs are valid; nothing was trained\n";
  std::cout << printable_text(os.str())
            << std::flush;  // paths and names from the recipe, shown safely
  return kExitOk;
}

}  // namespace

int run_recipe(const CliOptions& o) {
  if (o.recipe.empty())
    throw UsageError("no recipe given (usage: ciuic-run RECIPE [options]; see ciuic-run --help)");
  recipe::ErrorList problems;
  const Recipe recipe = Recipe::load(o.recipe, effective_overrides(o), &problems);
  if (!problems.empty()) {
    // One report for the core and the plugin sections alike (docs/recipe.md), as far as the
    // plugins can be found with what the recipe says.
    try {
      recipe.validate_plugins(Registry::discover(plugin_paths(o, &recipe)), &problems);
    } catch (const Error&) {
    }
    problems.throw_if_any("recipe " + o.recipe);
  }
  apply_log_level(recipe);
  if (!launch::detect_worker_env() || launch::detect_worker_env()->rank == 0)
    for (const std::string& w : recipe.warnings()) log_warn(w);
  // Before anything touches CUDA; the workers the launcher starts inherit it.
  log_debug("CUDA allocator: " + launch::apply_allocator_defaults());
  const Registry registry = Registry::discover(plugin_paths(o, &recipe));
  if (o.plan) {  // needs the precision, sharding and optimizer plugins (a CPU build plans GPU
                 // recipes)
    // An unknown plugin is a recipe error with its location, as for a run; a CUDA plugin a build
    // without CUDA lacks is not (the plan says it did not count it).
    const bool gpu_recipe_cpu_build =
        recipe.section("cluster").get_string("device") == "cuda" && !at::hasCUDA();
    for (int i = 0; i < kNumSlots; ++i) {
      const Slot slot = static_cast<Slot>(i);
      const std::string name = recipe.plugin_name(slot);
      if (name.empty() || registry.find(slot, name) || gpu_recipe_cpu_build) continue;
      const std::string where = recipe.plugin_location(slot);
      throw UsageError((where.empty() || where == "<default>" ? recipe.path() : where) + ": " +
                       registry.why_missing(slot, name));
    }
    std::cout << printable_text(plan::plan_text(plan::plan_memory(recipe, registry))) << std::flush;
    return kExitOk;
  }
  recipe.validate_plugins(registry);
  train::check_recipe(recipe);
  if (o.print_recipe) {
    std::cout << printable_text(recipe.resolved_toml(registry)) << std::flush;
    return kExitOk;
  }
  if (o.dry_run) return dry_run(recipe, registry, o.resume);

  const auto worker_env = launch::detect_worker_env();
  if (!worker_env) {  // the launcher: what the plan says before any worker allocates
    std::optional<plan::MemoryPlan> mp;
    try {
      mp = plan::plan_memory(recipe, registry);
    } catch (const std::exception& e) {  // an estimate: a run never fails for want of one
      log_debug(std::string("no memory plan: ") + e.what());
    }
    if (mp && !mp->fits)
      log_warn(
          "the memory plan says this recipe does not fit [cluster] memory_per_device_gib "
          "(see ciuic-run " +
          o.recipe + " --plan):\n" + plan::plan_text(*mp));
    else if (mp && !mp->host_fits)
      log_warn("the memory plan needs " + plan::bytes_text(mp->node_memory) +
               " of this node's memory for " + std::to_string(mp->local_world_size) +
               " rank(s), more than the " + plan::bytes_text(mp->host_available) +
               " it has: the kernel may kill the workers (see ciuic-run " + o.recipe + " --plan)");
  }
  train::WorkerOptions wopts;
  wopts.resume = o.resume;
  wopts.overwrite = o.overwrite;
  if (worker_env) {
    // Under ciuic-run's own launcher, the launcher of node 0 claimed the run directory for the
    // run; under any other launcher, rank 0 claims it (checkpoint/run_dir.h).
    wopts.claim_run_dir = worker_env->launcher != "ciuic";
    return train::run_worker(recipe, registry, *worker_env, wopts);
  }
  const Config cluster = recipe.section("cluster");
  const int nproc = static_cast<int>(cluster.get_int("nproc_per_node"));
  const int nnodes = static_cast<int>(cluster.get_int("nnodes"));
  // Before any worker builds anything: one process per run checks the folders, takes the run
  // lock (held until this process ends) and refuses or moves another run's files.
  checkpoint::RunDirClaim claim;
  if (o.node_rank == 0)
    claim = checkpoint::claim_run_dir(train::TrainOptions::from(recipe).run_paths(),
                                      {o.resume, o.overwrite});
  if (nproc * nnodes == 1) {
    launch::WorkerEnv env;
    env.launcher = "none";
    env.master_addr = o.master_addr;
    env.master_port = o.master_port;
    return train::run_worker(recipe, registry, env, wopts);
  }
  launch::LaunchOptions lo;
  lo.argv = o.argv;
  lo.nproc_per_node = nproc;
  lo.nnodes = nnodes;
  lo.node_rank = o.node_rank;
  lo.master_addr = o.master_addr;
  lo.master_port = o.master_port;
  lo.output_all_ranks = cluster.get_string("output") == "all";
  lo.rendezvous_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(cluster.get_float("timeout_s") * 1000));
  lo.store_token_file =
      train::TrainOptions::from(recipe).run_paths().output_dir + "/.ciuic-store-token";
  return launch::launch_and_supervise(lo);
}

int list_plugins(const Registry& registry, bool verbose, std::ostream& shown_out,
                 std::ostream& shown_err) {
  // Plugin summaries, option help and file names come from the files found: shown safely.
  std::ostringstream out, err;
  const auto plugins = registry.list();
  size_t wname = 4, wver = 7;
  for (const auto& d : plugins) {
    wname = std::max(wname, d.name.size());
    wver = std::max(wver, d.version.size());
  }
  for (const auto& d : plugins) {
    out << pad(slot_name(d.slot), 10) << pad(d.name, wname + 2) << pad(d.version, wver + 2)
        << d.path << "\n";
    if (!verbose) continue;
    out << "    " << d.summary << "\n";
    if (d.info->num_options == 0) out << "    (no options)\n";
    std::vector<std::pair<std::string, std::string>> cols;  // "key = default", expected
    size_t w1 = 0, w2 = 0;
    for (uint32_t i = 0; i < d.info->num_options; ++i) {
      const recipe::KeySpec k = recipe::key_from_option(d.info->options[i]);
      cols.emplace_back(k.key + " = " + recipe::default_text(k), recipe::describe_expected(k));
      w1 = std::max(w1, cols.back().first.size());
      w2 = std::max(w2, cols.back().second.size());
    }
    for (uint32_t i = 0; i < d.info->num_options; ++i)
      out << "    " << pad(cols[i].first, w1 + 2) << pad(cols[i].second, w2 + 2)
          << d.info->options[i].help << "\n";
  }
  if (plugins.empty()) out << "(no plugins found)\n";
  if (verbose) {
    out << "\nsearch path (later folders win on duplicate names):\n";
    for (const auto& p : registry.search_path()) out << "  " << p << "\n";
    for (const auto& s : registry.shadowed()) out << "shadowed: " << s << "\n";
  }
  for (const auto& r : registry.refusals()) err << "ciuic-run: warning: refused " << r << "\n";
  shown_out << printable_text(out.str()) << std::flush;
  shown_err << printable_text(err.str()) << std::flush;
  return kExitOk;
}

std::string version_text() {
  std::ostringstream os;
  os << "ciuic-run (ciuic) " << CIUIC_VERSION << "\n"
     << "LibTorch " << TORCH_VERSION << "\n"
     << "build fingerprint: " << core_build_fingerprint() << "\n"
     << "plugin API version: " << kPluginApiVersion << "\n";
  return os.str();
}

std::string recipe_sections_text() {
  std::ostringstream os;
  for (const auto& s : recipe::core_schema())
    os << "  " << pad("[" + s.name + "]", 16) << s.help << "\n";
  return os.str();
}

std::string recipe_reference_text() {
  std::ostringstream os;
  for (const auto& s : recipe::core_schema()) {
    os << "[" << s.name << "]  " << s.help << "\n";
    for (const auto& k : s.keys)
      os << "  " << pad(k.key + " = " + recipe::default_text(k), 40) << " "
         << pad(recipe::describe_expected(k), 36) << " " << k.help << "\n";
    if (s.plugin_slot)
      os << "  (plus the options of the chosen plugin: ciuic-run --list-plugins --verbose)\n";
    os << "\n";
  }
  return os.str();
}

namespace {

// Shows what an import found on `err` and writes the recipe to `out_path` (or `out`).
// -o FILE of the importers, checked before anything is converted (the data of --from-llamafactory
// is written beside it): a refused name, a path through a file or a folder in its place is a usage
// error naming -o, and nothing is left half-written.
void check_output_file(const std::string& out_path) {
  if (out_path.empty() || out_path == "-") return;
  const fs::path o = fs::path(out_path);
  std::string why = paths::folder_problem(o.has_parent_path() ? o.parent_path().string() : ".");
  if (why.empty() && paths::is(out_path, paths::Want::kFolder)) why = "a folder, not a file";
  if (why.empty() && !paths::is(out_path, paths::Want::kAny)) {
    const std::string p = paths::problem(out_path, paths::Want::kAny);
    if (p != "no such file or folder") why = p;
  }
  if (!why.empty()) throw UsageError("-o " + out_path + " cannot be written: " + why);
}

int write_import(const importer::DeepSpeedImport& im, const std::string& out_path,
                 std::ostream& out, std::ostream& err) {
  // Notes and ignored keys quote the config's keys: one line each, control bytes shown as \xNN.
  // Written at once: std::cerr flushes every insertion (300k ignored keys were 600k writes).
  const auto line = [](const std::string& s) {
    return printable_text(s, /*keep_lines=*/false) + "\n";
  };
  std::string listed;
  for (const auto& n : im.notes) listed += "ciuic-run: note: " + line(n);
  for (const auto& i : im.ignored) listed += "ciuic-run: ignored: " + line(i);
  if (!im.placeholders.empty())
    listed += "ciuic-run: placeholders to edit (or give with --set): " +
              line(text::join(im.placeholders, ", "));
  err << listed << std::flush;
  if (out_path.empty() || out_path == "-") {
    out << im.toml;
    return kExitOk;
  }
  {
    std::ofstream f(out_path, std::ios::binary | std::ios::trunc);
    f << im.toml;
    if (!f) throw Error("cannot write " + out_path + ": " + std::strerror(errno));
  }
  err << line("ciuic-run: wrote " + out_path + " (check it: ciuic-run " + out_path +
              " --print-recipe)");
  return kExitOk;
}

}  // namespace

int from_deepspeed(const std::string& config, const std::vector<std::string>& overrides,
                   const std::string& out_path, std::ostream& out, std::ostream& err) {
  if (const std::string why = paths::problem(config, paths::Want::kFile); !why.empty())
    throw UsageError("--from-deepspeed " + config + ": " + why +
                     " (expected a DeepSpeed config JSON file)");
  check_output_file(out_path);
  std::ifstream in(config, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return write_import(importer::import_deepspeed(ss.str(), config, overrides), out_path, out, err);
}

int from_training_file(const std::string& tool, const std::string& file,
                       const std::vector<std::string>& overrides, const std::string& out_path,
                       std::ostream& out, std::ostream& err) {
  const importer::TrainingTool t =
      tool == "axolotl" ? importer::TrainingTool::kAxolotl : importer::TrainingTool::kLlamaFactory;
  if (const std::string why = paths::problem(file, paths::Want::kFile); !why.empty())
    throw UsageError("--from-" + tool + " " + file + ": " + why +
                     " (expected a training config YAML file)");
  check_output_file(out_path);
  fs::path data_dir = "ciuic-data";
  if (!out_path.empty() && out_path != "-") {
    const fs::path o(out_path);
    data_dir = o.parent_path() / (o.stem().string() + "-data");
  }
  const importer::TrainingImport im =
      importer::import_training_file(t, file, overrides, data_dir.string());
  return write_import(im.recipe, out_path, out, err);
}

// --tokenizer names a tokenizer.json: says what else it is (the message was "no such file" for
// /dev/zero and for folders alike).
void check_tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::regular) return;
  const std::string head = "--tokenizer " + path + ": ";
  switch (st.type()) {
    case fs::file_type::not_found:
      throw UsageError(head + "no such file (expected a tokenizer.json file)");
    case fs::file_type::directory:
      throw UsageError(head + "a folder, not a tokenizer.json file" +
                       (fs::is_regular_file(fs::path(path) / "tokenizer.json", ec)
                            ? " (give " + (fs::path(path) / "tokenizer.json").string() + ")"
                            : " (and not a tokenizer folder: it holds no tokenizer.json)"));
    case fs::file_type::character:
    case fs::file_type::block:
      throw UsageError(head + "not a regular file (a device): expected a tokenizer.json file");
    case fs::file_type::fifo:
      throw UsageError(head + "not a regular file (a FIFO): expected a tokenizer.json file");
    case fs::file_type::socket:
      throw UsageError(head + "not a regular file (a socket): expected a tokenizer.json file");
    default:
      throw UsageError(head + "cannot be read" + (ec ? ": " + ec.message() : std::string()) +
                       " (expected a tokenizer.json file)");
  }
}

int plot(const std::string& run_dir, std::ostream& out) {
  out << report::write_html_report(run_dir) << "\n";
  return kExitOk;
}

namespace {

// 1: the run holding `run_dir`'s lock is alive on this host; 0: no run holds it (no lock file, or
// its holder is gone); -1: its holder is on another host.
int run_alive(const std::string& run_dir) {
  std::error_code ec;
  fs::path folder = run_dir;
  if (!fs::is_directory(folder, ec)) folder = folder.parent_path();
  std::ifstream f(folder / checkpoint::kLockFile);
  if (!f) return 0;
  std::string pid, host;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("pid=", 0) == 0) pid = line.substr(4);
    if (line.rfind("host=", 0) == 0) host = line.substr(5);
  }
  if (pid.empty()) return 0;
  char here[256] = {};
  gethostname(here, sizeof here - 1);
  if (!host.empty() && host != here) return -1;
  const long p = std::strtol(pid.c_str(), nullptr, 10);
  if (p <= 0) return 0;
  return ::kill(static_cast<pid_t>(p), 0) == 0 || errno == EPERM ? 1 : 0;
}

}  // namespace

int watch(const std::string& run_dir, double interval_s, bool tty, std::ostream& out) {
  if (!(interval_s > 0) || interval_s > 3600)
    throw UsageError("--interval " + std::to_string(interval_s) +
                     ": expected seconds in (0, 3600]");
  report::WatchOptions wo;
  wo.interval_s = interval_s;
  wo.tty = tty;
  wo.run_alive = [run_dir] { return run_alive(run_dir); };
  return report::watch(run_dir, out, wo);
}

namespace {
// The merged model of a LoRA checkpoint: its base (adapter config's base_model_name_or_path) with
// the checkpoint's adapter (and modules_to_save) loaded and merged, in fp32 on the CPU.
model::NamedTensors merged_weights(const std::string& folder, const nlohmann::json& adapter) {
  const std::string where = folder + "/trainer.json adapter";
  const model::LoraSpec spec = model::lora_spec_from_peft(adapter, where);
  const std::string base = adapter.value("base_model_name_or_path", std::string());
  if (base.empty())
    throw UsageError("--merge: " + where +
                     " names no base model folder (the run trained from a random init): "
                     "there are no base weights to merge into");
  auto m = model::LlamaModel::from_pretrained(base, at::kFloat, at::kCPU);
  // QLoRA: the base the adapter was trained on is the NF4 one, quantized from the weights in the
  // run's dtype; the merge adds the adapter to its dequantized weights (model/llama.h, merge_lora).
  if (const auto q = adapter.find("ciuic_base_quantization"); q != adapter.end()) {
    const std::string dt = q->value("dtype", std::string("float32"));
    if (q->value("quant_type", std::string()) != "nf4")
      throw Error(where + ": ciuic_base_quantization is not nf4");
    if (dt != "float32") {
      at::NoGradGuard no_grad;
      const at::ScalarType st = dt == "bfloat16" ? at::kBFloat16 : at::kHalf;
      for (auto& [name, t] : m->named_parameters()) t.copy_(t.to(st));  // rounded as trained
    }
    m->quantize_base({}, q->value("blocksize", int64_t{64}), q->value("double_quant", true));
  }
  m->enable_lora(spec);
  const model::NamedTensors saved = checkpoint::read_master_weights(folder);
  const auto params = m->trainable_parameters();
  if (saved.size() != params.size())
    throw Error(where + ": the checkpoint holds " + std::to_string(saved.size()) +
                " tensors, the adapter " + std::to_string(params.size()));
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (saved[i].first != params[i].first || saved[i].second.sizes() != params[i].second.sizes())
        throw Error(where + ": tensor `" + saved[i].first + "` does not match the base model " +
                    base + " (expected `" + params[i].first + "`)");
      params[i].second.copy_(saved[i].second);
    }
  }
  m->merge_lora();
  model::NamedTensors out;
  for (auto& [name, t] : m->named_parameters()) out.emplace_back(name, t.detach());
  return out;
}
}  // namespace

int export_hf(const std::string& checkpoint, const std::string& out_dir, const std::string& dtype,
              const std::string& tokenizer, std::ostream& out, bool merge) {
  namespace fs = std::filesystem;
  const std::optional<at::ScalarType> export_dtype = model::export_dtype_from_name(dtype);
  if (!export_dtype)
    throw UsageError("--export-dtype " + dtype + ": expected one of " +
                     model::export_dtype_names());
  if (!tokenizer.empty()) check_tokenizer_file(tokenizer);
  if (out_dir.empty()) throw UsageError("--export-hf needs an output folder: --export-hf CKPT OUT");
  std::error_code ec;
  if (const std::string why = paths::folder_problem(out_dir); !why.empty())
    throw UsageError("--export-hf OUT " + out_dir + " cannot be written: " + why);
  if (paths::is(out_dir, paths::Want::kAny) &&
      !(paths::is(out_dir, paths::Want::kFolder) && fs::is_empty(out_dir, ec) && !ec))
    throw UsageError("--export-hf: " + out_dir +
                     " exists and is not an empty folder (refusing to overwrite it)");
  const std::string folder = checkpoint::resolve(checkpoint, checkpoint, "--export-hf");
  checkpoint::verify(folder, /*checksums=*/true);
  const model::LlamaConfig config = checkpoint::read_model_config(folder);
  const nlohmann::json adapter = checkpoint::read_adapter_config(folder);
  if (merge && adapter.is_null())
    throw UsageError(
        "--merge: " + folder +
        " is not a LoRA checkpoint (it holds the full model: export it without --merge)");
  model::HfExportOptions eo;
  eo.dtype = *export_dtype;
  // The tokenizer the checkpoint keeps (written by runs with a tokenizer), unless --tokenizer
  // names another.
  const fs::path kept = fs::path(folder) / "tokenizer.json";
  eo.extra_files =
      model::tokenizer_files(!tokenizer.empty()                            ? tokenizer
                             : paths::is(kept.string(), paths::Want::kAny) ? kept.string()
                                                                           : "");
  // Assembled beside OUT, renamed into place when complete.
  const fs::path target = fs::absolute(out_dir).lexically_normal();
  const fs::path tmp = target.parent_path() / (".tmp-" + target.filename().string());
  remove_tree((tmp).string(), ec);
  try {
    if (!adapter.is_null() && !merge)
      model::write_peft_folder(tmp.string(), adapter, checkpoint::read_master_weights(folder),
                               eo.dtype);
    else
      model::write_hf_folder(
          tmp.string(), config,
          merge ? merged_weights(folder, adapter) : checkpoint::read_master_weights(folder), eo);
    if (paths::is(target.string(), paths::Want::kAny) && !fs::remove(target, ec) &&
        ec)  // the empty folder
      throw Error("--export-hf: cannot replace the empty folder " + target.string() + ": " +
                  ec.message());
    fs::rename(tmp, target, ec);
    if (ec)
      throw Error("--export-hf: cannot rename " + tmp.string() + " to " + target.string() + ": " +
                  ec.message());
  } catch (...) {
    remove_tree((tmp).string(), ec);
    throw;
  }
  // An adapter export writes the adapter's tensors only: their count, not the base's.
  const std::string count =
      !adapter.is_null() && !merge
          ? std::to_string(model::lora_num_parameters(
                config, model::lora_spec_from_peft(adapter, folder + "/trainer.json adapter"))) +
                " adapter parameters of a " + std::to_string(config.num_parameters()) +
                "-parameter base"
          : std::to_string(config.num_parameters()) + " parameters";
  out << "exported " << folder << " (" << count << ", " << dtype << ") to " << target.string()
      << "\n";
  return kExitOk;
}

}  // namespace ciuic::app
