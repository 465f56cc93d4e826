// write_hf_folder: safetensors + config.json + generation_config.json, swapped into place.
#include "model/hf_export.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>

#include "base/paths.h"
#include "model/llama.h"

namespace ciuic::model {

namespace {
struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};
constexpr DtypeName kExportDtypes[] = {{"bf16", at::kBFloat16}, {"fp32", at::kFloat}};
}  // namespace

std::optional<at::ScalarType> export_dtype_from_name(std::string_view name) {
  for (const DtypeName& d : kExportDtypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::string export_dtype_names() {
  std::string s;
  for (const DtypeName& d : kExportDtypes) s += (s.empty() ? "" : "|") + std::string(d.name);
  return s;
}

namespace fs = std::filesystem;

namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Removes the folder on scope exit unless released.
struct TempDir {
  fs::path path;
  bool keep = false;
  ~TempDir() {
    if (!keep && !path.empty()) {
      std::error_code ec;
      remove_tree((path).string(), ec);
    }
  }
};

}  // namespace

std::vector<std::string> tokenizer_files(const std::string& tokenizer_json) {
  if (tokenizer_json.empty()) return {};
  std::vector<std::string> out{tokenizer_json};
  const fs::path dir = fs::path(tokenizer_json).parent_path();
  for (const char* name : {"tokenizer_config.json", "chat_template.jinja"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) out.push_back((dir / name).string());
  }
  return out;
}

void write_hf_folder(const std::string& folder, const LlamaConfig& config,
                     const NamedTensors& tensors, const HfExportOptions& options) {
  if (options.dtype != at::kBFloat16 && options.dtype != at::kFloat && options.dtype != at::kHalf)
    throw Error(folder + ": export dtype must be bfloat16, float16 or float32, not " +
                c10::toString(options.dtype));
  // The tensors must be exactly the architecture's parameters, or transformers would not load them.
  std::map<std::string, std::vector<int64_t>> want;
  for (auto& spec : llama_parameter_specs(config)) want[spec.name] = spec.shape;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    auto it = want.find(name);
    if (it == want.end())
      throw Error(folder + ": cannot export tensor `" + name +
                  "`: not a parameter of this Llama config" +
                  (name == "lm_head.weight" ? " (the embeddings are tied)" : ""));
    if (!t.defined() || t.sizes() != c10::IntArrayRef(it->second))
      throw Error(folder + ": cannot export tensor `" + name + "`: shape " +
                  (t.defined() ? shape_str(t.sizes()) : std::string("undefined")) +
                  ", the config needs " + shape_str(it->second));
    if (!at::isFloatingType(t.scalar_type()))
      throw Error(folder + ": cannot export tensor `" + name + "`: dtype " +
                  c10::toString(t.scalar_type()) + " is not floating-point");
    if (!seen.insert(name).second)
      throw Error(folder + ": cannot export tensor `" + name + "`: given twice");
  }
  for (const auto& [name, _] : want)
    if (!seen.count(name))
      throw Error(folder + ": cannot export: tensor `" + name + "` is missing");
  for (const auto& f : options.extra_files)
    if (const std::string why = paths::problem(f, paths::Want::kFile); !why.empty())
      throw Error(folder + ": cannot export: extra file " + f + ": " + why);

  const fs::path target = fs::absolute(fs::path(folder)).lexically_normal();
  const fs::path parent = target.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    throw Error(folder + ": cannot create the parent folder " + parent.string() + ": " +
                ec.message());
  TempDir tmp;
  tmp.path = parent / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  remove_tree((tmp.path).string(), ec);
  if (!fs::create_directory(tmp.path, ec))
    throw Error(folder + ": cannot create " + tmp.path.string() + ": " + ec.message());

  SafetensorsWriteOptions wo;
  wo.float_dtype = options.dtype;
  wo.metadata = {{"format", "pt"}};
  write_safetensors_sharded(tmp.path.string(), tensors, options.max_shard_bytes, wo);
  LlamaConfig out_cfg = config;
  out_cfg.torch_dtype = options.dtype == at::kBFloat16 ? "bfloat16"
                        : options.dtype == at::kHalf   ? "float16"
                                                       : "float32";
  write_file_atomic((tmp.path / "config.json").string(), out_cfg.to_json().dump(2) + "\n");
  write_file_atomic((tmp.path / "generation_config.json").string(),
                    config.generation_json().dump(2) + "\n");
  for (const auto& f : options.extra_files) {
    const fs::path dst = tmp.path / fs::path(f).filename();
    if (!fs::copy_file(f, dst, fs::copy_options::overwrite_existing, ec))
      throw Error(folder + ": cannot copy " + f + ": " + ec.message());
  }

  // Swap into place.
  if (!paths::is(target.string(), paths::Want::kAny)) {
    if (::rename(tmp.path.c_str(), target.c_str()) != 0)
      throw Error(folder + ": cannot rename " + tmp.path.string() +
                  " into place: " + std::strerror(errno));
    tmp.keep = true;
  } else {
    if (!paths::is(target.string(), paths::Want::kFolder))
      throw Error(folder + ": exists and is not a folder");
    if (::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      // Filesystems without RENAME_EXCHANGE: move the old folder aside, then the new one in.
      const fs::path old =
          parent / ("." + target.filename().string() + ".old-" + std::to_string(::getpid()));
      remove_tree((old).string(), ec);
      if (::rename(target.c_str(), old.c_str()) != 0)
        throw Error(folder + ": cannot move the existing folder aside: " + std::strerror(errno));
      if (::rename(tmp.path.c_str(), target.c_str()) != 0) {
        const int err = errno;
        ::rename(old.c_str(), target.c_str());
        throw Error(folder + ": cannot rename the new folder into place: " + std::strerror(err));
      }
      remove_tree((old).string(), ec);
      tmp.keep = true;
    }
    // After the exchange tmp.path holds the old folder: TempDir removes it.
  }
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace ciuic::model
