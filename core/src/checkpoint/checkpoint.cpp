// Checkpoints: see checkpoint.h for the format and the guarantees.
#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <ciuic/checksum.h>
#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/log.h>

#include "base/paths.h"
#include "checkpoint/run_dir.h"

namespace fs = std::filesystem;

namespace ciuic::checkpoint {

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

// A JSON library exception met while reading a checkpoint's trainer.json (a field missing or of
// the wrong type) as an Error naming the folder.
[[noreturn]] void malformed(const std::string& folder, const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (what.size() > 200) what = what.substr(0, 200) + "...";
  throw Error("checkpoint " + folder + ": malformed trainer.json or manifest.json (" + what + ")");
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// A new run id: the UTC start time and 64 random bits ("20260102T101112Z-3fa2c1d9e0b4a7f1").
std::string new_run_id() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx", stamp, static_cast<unsigned long long>(r));
  return buf;
}

nlohmann::json shape_json(const RunShape& s) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& [name, shape] : s.params) params.push_back({{"name", name}, {"shape", shape}});
  nlohmann::json j = {{"model_config", s.model.to_json()},
                      {"global_rows", s.global_rows},
                      {"seq_len", s.seq_len},
                      {"params", params}};
  if (!s.adapter.is_null()) j["adapter"] = s.adapter;
  return j;
}

// Every rank file's shard layout, and slice lookup across them.
class ShardSet {
 public:
  ShardSet(const fs::path& folder, int world) {
    for (int r = 0; r < world; ++r) {
      auto f = model::SafetensorsFile::open((folder / rank_file(r)).string());
      auto it = f->metadata().find("layout");
      if (it == f->metadata().end())
        throw Error(f->path() + ": no shard layout in the metadata (not a ciuic checkpoint file)");
      check_json_depth(it->second, f->path() + ": shard layout");
      nlohmann::json layout;
      try {
        layout = nlohmann::json::parse(it->second);
      } catch (const nlohmann::json::exception& e) {
        throw Error(f->path() + ": malformed shard layout: " + e.what());
      }
      for (const auto& s : layout)
        pieces_[s.at(0).get<std::string>()].push_back(
            Piece{r, s.at(1).get<int64_t>(), s.at(2).get<int64_t>(), s.at(3).get<int64_t>()});
      files_.push_back(std::move(f));
    }
    for (auto& [name, v] : pieces_)
      std::sort(v.begin(), v.end(),
                [](const Piece& a, const Piece& b) { return a.param_offset < b.param_offset; });
  }

  at::Tensor fetch(const std::string& state, const std::string& param, int64_t offset,
                   int64_t length) const {
    auto it = pieces_.find(param);
    if (it == pieces_.end())
      throw Error("checkpoint " + folder_of() + " holds no state for parameter " + param);
    int64_t end = 0;
    if (offset < 0 || length < 0 || __builtin_add_overflow(offset, length, &end))
      throw Error("checkpoint " + folder_of() + ": elements [" + std::to_string(offset) + ", +" +
                  std::to_string(length) + ") of " + param + " are out of range");
    // Pieces are sorted by parameter offset; replicated shards (DDP: every rank holds
    // everything) overlap, and each element is taken once. The pieces are walked twice: first to
    // check they cover the range (before allocating what a damaged file may claim), then to copy.
    auto walk = [&](const std::function<void(const Piece&, int64_t, int64_t)>& take) {
      int64_t pos = offset;
      for (const Piece& p : it->second) {
        if (pos >= end) break;
        const int64_t s = std::max(pos, p.param_offset);
        const int64_t e = std::min(end, p.param_offset + p.length);
        if (e <= s) continue;
        if (s > pos) break;  // a gap
        take(p, s, e);
        pos = e;
      }
      return pos;
    };
    const int64_t covered = walk([](const Piece&, int64_t, int64_t) {});
    if (covered != end)
      throw Error("checkpoint " + folder_of() + " has no " + state + " state for elements [" +
                  std::to_string(covered) + ", " + std::to_string(end) + ") of " + param);
    at::Tensor out = at::empty({length}, at::kFloat);
    walk([&](const Piece& p, int64_t s, int64_t e) {
      at::Tensor src = files_[p.file]->tensor(state);
      out.narrow(0, s - offset, e - s)
          .copy_(src.narrow(0, p.shard_offset + (s - p.param_offset), e - s));
    });
    return out;
  }

 private:
  std::string folder_of() const {
    return files_.empty() ? "?" : fs::path(files_[0]->path()).parent_path().string();
  }
  struct Piece {
    int file;
    int64_t param_offset, length, shard_offset;
  };
  std::vector<std::shared_ptr<const model::SafetensorsFile>> files_;
  std::map<std::string, std::vector<Piece>> pieces_;
};

// What differs between a checkpoint's run shape and this run's, as sentences.
std::vector<std::string> shape_differences(const nlohmann::json& saved, const RunShape& now) {
  std::vector<std::string> out;
  const nlohmann::json cur = shape_json(now);
  const auto& a = saved.at("model_config");
  const auto& b = cur.at("model_config");
  for (const auto& [k, v] : b.items()) {
    // Special token ids do not shape the weights: a checkpoint from before the ids were taken
    // from the tokenizer resumes (the run's ids are the ones written from then on).
    if (k == "torch_dtype" || k == "transformers_version" || k == "bos_token_id" ||
        k == "eos_token_id" || k == "pad_token_id")
      continue;
    if (!a.contains(k))
      out.push_back("model " + k + ": absent in the checkpoint, " + v.dump() + " now");
    else if (a.at(k) != v)
      out.push_back("model " + k + ": " + a.at(k).dump() + " in the checkpoint, " + v.dump() +
                    " now");
  }
  for (const char* k : {"global_rows", "seq_len"})
    if (saved.at(k) != cur.at(k))
      out.push_back(std::string(k) + ": " + saved.at(k).dump() + " in the checkpoint, " +
                    cur.at(k).dump() + " now" +
                    (std::string(k) == "global_rows"
                         ? " (micro_batch_size x gradient_accumulation_steps x world size must "
                           "stay the same)"
                         : ""));
  if (out.empty() && saved.at("params") != cur.at("params"))
    out.push_back("the parameter names or shapes differ");
  return out;
}

model::NamedTensors read_state_file(const fs::path& p) {
  model::NamedTensors out;
  auto f = model::SafetensorsFile::open(p.string());
  for (const auto& e : f->entries()) out.emplace_back(e.name, f->tensor(e.name).clone());
  return out;
}

}  // namespace

// ---- lookup
// ---------------------------------------------------------------------------------------
namespace {
// Complete checkpoint folders under `dir`, oldest first.
std::vector<fs::path> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  // At most 18 digits (what int64 holds): a folder with more is not a checkpoint of ours.
  static const std::regex re("step_([0-9]{1,18})");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (e.is_directory(ec) && std::regex_match(n, m, re) &&
        paths::is((e.path() / "manifest.json").string(), paths::Want::kAny))
      found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}
}  // namespace

std::string resolve(const std::string& spec, const std::string& dir, const std::string& option) {
  std::string d = dir;
  if (spec != "latest") {
    if (paths::is((fs::path(spec) / "manifest.json").string(), paths::Want::kAny)) return spec;
    if (const std::string why = paths::problem(spec, paths::Want::kFolder); !why.empty())
      throw UsageError(option + " " + spec + ": no such checkpoint folder" +
                       (why == "no such folder" ? std::string() : " (" + why + ")"));
    d = spec;
  }
  auto all = complete_checkpoints(d);
  if (all.empty())
    throw UsageError(option + " " + spec + ": no complete checkpoint in " + d +
                     (spec == "latest" ? " (the recipe's [checkpoint] dir)" : ""));
  return all.back().string();
}

std::string latest(const std::string& dir) {
  auto all = complete_checkpoints(dir);
  return all.empty() ? std::string() : all.back().string();
}

std::string Checkpointer::latest() const { return checkpoint::latest(dir_); }

// ---- save ---------------------------------------------------------------------------------------
Checkpointer::Checkpointer(std::string dir, int64_t keep_last, const RunContext& ctx)
    : dir_(std::move(dir)), keep_last_(keep_last), ctx_(ctx), run_id_(new_run_id()) {}

bool Checkpointer::ours(const std::string& folder) const {
  std::error_code ec;
  if (!loaded_.empty() && fs::equivalent(folder, loaded_, ec)) return true;
  return read_run_id(folder) == run_id_;
}

std::string Checkpointer::save(const TrainerState& st, const RunShape& shape, const Parts& parts) {
  Store& store = *ctx_.store;
  const std::string key = "ckpt/save" + std::to_string(++saves_) + "/";
  const fs::path final_dir = fs::path(dir_) / step_name(st.step);
  const fs::path tmp = fs::path(dir_) / (".tmp-" + step_name(st.step));
  const bool rank0 = ctx_.rank == 0;

  // 1. Rank 0 prepares an empty temporary folder (removing leftovers of crashed saves).
  if (rank0) {
    std::string status = "ok";
    try {
      fs::create_directories(dir_);
      for (const auto& e : fs::directory_iterator(dir_))
        if (e.path().filename().string().rfind(".tmp-", 0) == 0) {
          std::error_code rec;
          if (!remove_tree(e.path().string(), rec))
            throw std::filesystem::filesystem_error("cannot remove", e.path(), rec);
        }
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      status = std::string("cannot prepare checkpoint folder ") + tmp.string() + ": " + e.what();
    }
    store.set(key + "tmp", status);
    if (status != "ok") throw Error(status);
  } else {
    const std::string status = store.get(key + "tmp");
    if (status != "ok")
      throw Error("checkpoint at step " + std::to_string(st.step) + ": " + status);
  }

  // 2. Every rank writes and checksums its shard.
  nlohmann::json mine;
  try {
    StateDict sd;
    parts.sharding->save_state(sd);
    sd.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    // The rank's device generator too (LoRA dropout draws its masks there on a GPU).
    if (!ctx_.device.is_cpu()) {
      at::Generator gen = at::globalContext().defaultGenerator(ctx_.device);
      const std::lock_guard<std::mutex> lock(gen.mutex());
      sd.emplace_back("rng.device", gen.get_state());
    }
    nlohmann::json layout = nlohmann::json::array();
    for (const ShardSlice& s : parts.sharding->layout())
      layout.push_back({s.param, s.param_offset, s.length, s.shard_offset});
    model::SafetensorsWriteOptions wo;
    wo.metadata = {{"layout", layout.dump()},
                   {"rank", std::to_string(ctx_.rank)},
                   {"world_size", std::to_string(ctx_.world_size)}};
    const fs::path p = tmp / rank_file(ctx_.rank);
    model::NamedTensors named(sd.begin(), sd.end());
    model::write_safetensors(p.string(), named, wo);
    mine = {{"file", rank_file(ctx_.rank)},
            {"bytes", fs::file_size(p)},
            {"crc32c", crc32c_file(p.string())},
            {"cursor", parts.data->cursor()}};
  } catch (const std::exception& e) {
    mine = {{"error", "rank " + std::to_string(ctx_.rank) + ": " + e.what()}};
  }
  store.set(key + "rank/" + std::to_string(ctx_.rank), mine.dump());

  // 3. Rank 0 collects, writes the rest, then makes the folder visible in one rename.
  if (!rank0) {
    const std::string done_text = store.get(key + "done");
    check_json_depth(done_text, "checkpoint store key " + key + "done");
    const nlohmann::json done = nlohmann::json::parse(done_text);
    if (done.contains("error"))
      throw Error("checkpoint at step " + std::to_string(st.step) +
                  " failed: " + done["error"].get<std::string>());
    last_good_ = final_dir.string();
    return last_good_;
  }
  std::vector<nlohmann::json> ranks(ctx_.world_size);
  std::string errors;
  for (int r = 0; r < ctx_.world_size; ++r) {
    const std::string rank_text = store.get(key + "rank/" + std::to_string(r));
    check_json_depth(rank_text, "checkpoint store key " + key + "rank/" + std::to_string(r));
    ranks[r] = nlohmann::json::parse(rank_text);
    if (ranks[r].contains("error"))
      errors += (errors.empty() ? "" : "; ") + ranks[r]["error"].get<std::string>();
  }
  try {
    if (!errors.empty()) throw Error(errors);
    nlohmann::json files = nlohmann::json::object();
    nlohmann::json cursors = nlohmann::json::array();
    for (const auto& r : ranks) {
      files[r["file"].get<std::string>()] = {{"bytes", r["bytes"]}, {"crc32c", r["crc32c"]}};
      cursors.push_back(r["cursor"]);
    }
    StateDict psd;
    parts.precision->save_state(psd);
    if (!psd.empty()) {
      const fs::path p = tmp / "precision.safetensors";
      model::write_safetensors(p.string(), model::NamedTensors(psd.begin(), psd.end()));
      files["precision.safetensors"] = {{"bytes", fs::file_size(p)},
                                        {"crc32c", crc32c_file(p.string())}};
    }
    for (const std::string& f : shape.tokenizer_files) {
      const std::string name = fs::path(f).filename().string();
      const fs::path p = tmp / name;
      fs::copy_file(f, p, fs::copy_options::overwrite_existing);
      files[name] = {{"bytes", fs::file_size(p)}, {"crc32c", crc32c_file(p.string())}};
    }
    nlohmann::json trainer = {{"step", st.step},
                              {"updates", st.updates},
                              {"skipped", st.skipped},
                              {"nonfinite_skips", st.nonfinite_skips},
                              {"tokens", st.tokens},
                              {"run_id", run_id_},
                              {"world_size", ctx_.world_size},
                              {"data_cursors", cursors},
                              {"shape", shape_json(shape)}};
    const std::string tj = trainer.dump(2);
    model::write_file_atomic((tmp / "trainer.json").string(), tj);
    files["trainer.json"] = {{"bytes", tj.size()}, {"crc32c", crc32c(tj.data(), tj.size())}};
    nlohmann::json manifest = {{"format", kManifestFormat},
                               {"version", kManifestVersion},
                               {"step", st.step},
                               {"world_size", ctx_.world_size},
                               {"files", files}};
    model::write_file_atomic((tmp / "manifest.json").string(), manifest.dump(2));
    fsync_dir(tmp);
    if (fs::exists(final_dir) && !ours(final_dir.string())) {
      // Another run's checkpoint of this step (resumed from elsewhere into a folder holding it):
      // never deleted, moved aside.
      const fs::path aside = fs::path(dir_) / replaced_name() / step_name(st.step);
      fs::create_directories(aside.parent_path());
      fs::rename(final_dir, aside);
      log_warn("checkpoint " + final_dir.string() + " belonged to another run; moved to " +
               aside.string());
    }
    if (fs::exists(final_dir)) {  // re-saving the same step (e.g. a signal right after a save)
      const fs::path old = fs::path(dir_) / (".tmp-old-" + step_name(st.step));
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      std::error_code rec;
      if (!remove_tree(old.string(), rec))
        throw std::filesystem::filesystem_error("cannot remove", old, rec);
    } else {
      fs::rename(tmp, final_dir);
    }
    fsync_dir(dir_);
  } catch (const std::exception& e) {
    std::error_code ec;
    remove_tree((tmp).string(), ec);
    const std::string msg = e.what();
    store.set(key + "done", nlohmann::json{{"error", msg}}.dump());
    throw Error("checkpoint at step " + std::to_string(st.step) +
                " failed (the previous "
                "checkpoints are untouched): " +
                msg);
  }
  store.set(key + "done", nlohmann::json{{"ok", final_dir.string()}}.dump());
  last_good_ = final_dir.string();

  // 4. Prune, oldest first, now that the new one is complete: this lineage's checkpoints up to
  // this step only (checkpoint.h).
  if (keep_last_ > 0) {
    // complete_checkpoints() is sorted by step: everything up to the folder just saved.
    std::vector<fs::path> lineage;
    for (const fs::path& p : complete_checkpoints(dir_)) {
      if (ours(p.string())) lineage.push_back(p);
      if (p.filename() == final_dir.filename()) break;
    }
    // Each goes out of sight by one rename before it is deleted: a kill during the deletion leaves
    // a ".tmp-" folder (removed by the next save, never resumed from), not a step folder missing
    // some of its files.
    for (size_t i = 0; i + keep_last_ < lineage.size(); ++i) {
      std::error_code ec;
      const fs::path doomed = fs::path(dir_) / (".tmp-prune-" + lineage[i].filename().string());
      fs::rename(lineage[i], doomed, ec);
      if (!ec) fsync_dir(dir_);
      if (!ec) remove_tree(doomed.string(), ec);
      if (ec)
        log_warn("could not remove old checkpoint " + lineage[i].string() + ": " + ec.message());
    }
  }
  return last_good_;
}

// ---- load ---------------------------------------------------------------------------------------
TrainerState Checkpointer::load(const std::string& folder, const RunShape& shape,
                                const Parts& parts) try {
  const nlohmann::json manifest = verify(folder, /*checksums=*/false);
  const fs::path dir(folder);
  const nlohmann::json trainer = read_json(dir / "trainer.json");
  const auto diffs = shape_differences(trainer.at("shape"), shape);
  if (!diffs.empty()) {
    std::string msg = "cannot resume from " + folder + ": it was written by an incompatible run:";
    for (const auto& d : diffs) msg += "\n  " + d;
    throw UsageError(msg);
  }
  const int old_world = trainer.at("world_size").get<int>();
  const bool same_world = old_world == ctx_.world_size;

  // Verify the checksums of the files this rank reads.
  for (const auto& [name, info] : manifest.at("files").items()) {
    const bool needed = name == "trainer.json" || name == "precision.safetensors" || !same_world ||
                        name == rank_file(ctx_.rank);
    if (needed && crc32c_file((dir / name).string()) != info.at("crc32c").get<uint32_t>())
      throw Error("checkpoint " + folder + ": file " + name +
                  " fails its CRC-32C check (corrupted)");
  }

  // The precision policy's state first: the sharding rewrites the parameters from the loaded master
  // weights through the policy's rounding, for the last applied update (ciuic/sharding.h).
  if (paths::is((dir / "precision.safetensors").string(), paths::Want::kAny)) {
    const model::NamedTensors p = read_state_file(dir / "precision.safetensors");
    parts.precision->load_state(StateDict(p.begin(), p.end()));
  }
  ShardSet shards(dir, old_world);
  parts.sharding->load_state([&](const std::string& state, const std::string& param, int64_t off,
                                 int64_t len) { return shards.fetch(state, param, off, len); },
                             trainer.at("updates").get<int64_t>());
  const auto& cursors = trainer.at("data_cursors");
  if (!same_world)
    // The DataSource contract (ciuic/data.h): a cursor is a global position, the same on every
    // rank. A plugin whose cursors differ per rank cannot continue on another world size.
    for (const auto& c : cursors)
      if (c != cursors.at(0)) {
        std::string first = cursors.at(0).dump(), other = c.dump();
        if (first.size() > 80) first = first.substr(0, 80) + "...";
        if (other.size() > 80) other = other.substr(0, 80) + "...";
        throw UsageError("cannot resume " + folder + " on " + std::to_string(ctx_.world_size) +
                         " ranks: it was written on " + std::to_string(old_world) +
                         " ranks by a data plugin whose cursors differ per rank (" + first +
                         " and " + other + "), so no rank knows where the others were; resume on " +
                         std::to_string(old_world) +
                         " ranks, or make the plugin's cursor() a global position (ciuic/data.h)");
      }
  parts.data->seek(cursors.at(same_world ? ctx_.rank : 0).get<std::string>());
  if (same_world) {
    auto f = model::SafetensorsFile::open((dir / rank_file(ctx_.rank)).string());
    if (f->find("rng.cpu")) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default's state
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(f->tensor("rng.cpu").clone());
    }
    if (f->find("rng.device") && !ctx_.device.is_cpu()) {
      at::Generator gen = at::globalContext().defaultGenerator(ctx_.device);
      const std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(f->tensor("rng.device").clone());
    }
  }

  TrainerState st;
  st.step = trainer.at("step").get<int64_t>();
  st.updates = trainer.at("updates").get<int64_t>();
  st.skipped = trainer.at("skipped").get<int64_t>();
  st.nonfinite_skips = trainer.at("nonfinite_skips").get<int64_t>();
  st.tokens = trainer.at("tokens").get<double>();
  if (trainer.contains("run_id") && trainer["run_id"].is_string())
    run_id_ = trainer["run_id"].get<std::string>();
  loaded_ = folder;
  last_good_ = folder;
  if (ctx_.rank == 0) set_aside_later(folder);
  return st;
} catch (const nlohmann::json::exception& e) {
  malformed(folder, e);
}

void Checkpointer::set_aside_later(const std::string& folder) {
  fs::path loaded = fs::path(folder).lexically_normal();
  if (!loaded.has_filename()) loaded = loaded.parent_path();
  std::error_code ec;
  if (!fs::equivalent(loaded.parent_path(), dir_, ec)) return;  // resumed from another folder
  std::vector<fs::path> later;  // complete_checkpoints() is sorted by step
  bool after = false;
  for (const fs::path& p : complete_checkpoints(dir_)) {
    if (after) later.push_back(p);
    if (p.filename() == loaded.filename()) after = true;
  }
  if (later.empty()) return;
  fs::path aside = fs::path(dir_) / replaced_name();
  for (int i = 2; fs::exists(aside); ++i)
    aside = fs::path(dir_) / (replaced_name() + "-" + std::to_string(i));
  std::string names;
  for (const fs::path& p : later) {
    fs::create_directories(aside, ec);
    if (!ec) fs::rename(p, aside / p.filename(), ec);
    if (ec) {
      log_warn("cannot move the later checkpoint " + p.string() + " aside (" + ec.message() +
               "): --resume latest would pick it rather than this run's newest");
      continue;
    }
    names += (names.empty() ? "" : ", ") + p.filename().string();
  }
  if (!names.empty())
    log_warn("resumed from " + loaded.filename().string() + ", an earlier checkpoint than " +
             names + ": moved those into " + aside.string() +
             " (nothing is deleted), so that the newest "
             "checkpoint in " +
             dir_ + " is always this run's");
}

// ---- offline readers
// ------------------------------------------------------------------------------
model::LlamaConfig read_model_config(const std::string& folder) try {
  const nlohmann::json trainer = read_json(fs::path(folder) / "trainer.json");
  return model::LlamaConfig::from_json(trainer.at("shape").at("model_config"),
                                       (fs::path(folder) / "trainer.json").string());
} catch (const nlohmann::json::exception& e) {
  malformed(folder, e);
}

nlohmann::json read_adapter_config(const std::string& folder) try {
  const nlohmann::json trainer = read_json(fs::path(folder) / "trainer.json");
  return trainer.at("shape").value("adapter", nlohmann::json());
} catch (const nlohmann::json::exception& e) {
  malformed(folder, e);
}

model::NamedTensors read_master_weights(const std::string& folder) try {
  verify(folder, /*checksums=*/true);
  const fs::path dir(folder);
  const nlohmann::json trainer = read_json(dir / "trainer.json");
  ShardSet shards(dir, trainer.at("world_size").get<int>());
  model::NamedTensors out;
  for (const auto& p : trainer.at("shape").at("params")) {
    const auto name = p.at("name").get<std::string>();
    const auto shape = p.at("shape").get<std::vector<int64_t>>();
    int64_t n = 1;
    for (int64_t d : shape)
      if (d < 0 || __builtin_mul_overflow(n, d, &n))
        throw Error("checkpoint " + folder + ": malformed trainer.json: parameter " + name +
                    " has shape " + p.at("shape").dump() +
                    " (expected sizes >= 0 whose product fits 64 bits)");
    out.emplace_back(name, shards.fetch("master", name, 0, n).view(shape));
  }
  return out;
} catch (const nlohmann::json::exception& e) {
  malformed(folder, e);
}

}  // namespace ciuic::checkpoint
