// A checkpoint folder's JSON without LibTorch: see manifest.h (and checkpoint.h for the format).
#include "checkpoint/manifest.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include <ciuic/checksum.h>
#include <ciuic/error.h>
#include <ciuic/json.h>

#include "base/paths.h"

namespace fs = std::filesystem;

namespace ciuic::checkpoint {

namespace {

// The whole file, or nullopt when it cannot be opened.
std::optional<std::string> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// trainer.json's fields read before a run builds anything: null when the file is missing, nests
// deeper than kMaxJsonDepth or is not JSON ("cannot be read", as manifest.h says).
nlohmann::json read_soft(const fs::path& p) {
  const std::optional<std::string> text = slurp(p);
  if (!text || !json_depth_problem(*text).empty()) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

}  // namespace

nlohmann::json read_json(const fs::path& p) {
  const std::optional<std::string> text = slurp(p);
  if (!text) throw Error("cannot read " + p.string());
  check_json_depth(*text, p.string());
  try {
    return nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(p.string() + ": malformed JSON: " + e.what());
  }
}

namespace {

// A file name of a manifest for a message: at most 64 bytes, control bytes as \xNN.
std::string shown(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += name[i];
    }
  }
  return name.size() > 64 ? out + "..." : out;
}

// The manifest's structure, checked before any value is used: a hand-edited or foreign file gets a
// message naming it, not a JSON library exception; file names are plain names inside the folder
// (no "/", no control bytes: a NUL would end the name the file system sees), checksums fit 32 bits,
// and the version is compared whole (4294967297 is not version 1).
void check_manifest(const nlohmann::json& m, const fs::path& mpath) {
  auto bad = [&](const std::string& what) {
    return Error(mpath.string() + ": not a valid ciuic checkpoint manifest: " + what);
  };
  if (!m.is_object()) throw bad("expected a JSON object");
  if (!m.contains("format") || m["format"] != kManifestFormat)
    throw Error(mpath.string() + ": not a ciuic checkpoint manifest");
  if (!m.contains("version") || !m["version"].is_number_integer())
    throw bad("\"version\" must be an integer");
  if (m["version"] != kManifestVersion)
    throw Error(mpath.string() + ": checkpoint format version " + m["version"].dump() +
                ", this ciuic reads version " + std::to_string(kManifestVersion));
  if (!m.contains("files") || !m["files"].is_object()) throw bad("\"files\" must be an object");
  for (const auto& [name, info] : m["files"].items()) {
    const bool control = std::any_of(name.begin(), name.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
    });
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        control)
      throw bad("file name \"" + shown(name) +
                "\" is not a plain name inside the checkpoint folder");
    if (!info.is_object() || !info.contains("bytes") || !info["bytes"].is_number_unsigned() ||
        !info.contains("crc32c") || !info["crc32c"].is_number_unsigned())
      throw bad("file \"" + shown(name) + "\" needs unsigned integers \"bytes\" and \"crc32c\"");
    if (info["crc32c"].get<uint64_t>() > 0xFFFFFFFFu)
      throw bad("file \"" + shown(name) + "\": \"crc32c\" " + info["crc32c"].dump() +
                " is not a 32-bit checksum");
  }
}

}  // namespace

nlohmann::json verify(const std::string& folder, bool checksums) {
  const fs::path dir(folder);
  if (const std::string why = paths::problem(folder, paths::Want::kFolder); !why.empty())
    throw Error("checkpoint " + folder + " does not exist: " + why);
  const fs::path mpath = dir / "manifest.json";
  if (!paths::is(mpath.string(), paths::Want::kAny))
    throw Error("checkpoint " + folder + " is incomplete: manifest.json is missing");
  nlohmann::json m = read_json(mpath);
  check_manifest(m, mpath);
  for (const auto& [name, info] : m.at("files").items()) {
    const fs::path p = dir / name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) throw Error("checkpoint " + folder + ": file " + name + " is missing");
    if (size != info.at("bytes").get<uint64_t>())
      throw Error("checkpoint " + folder + ": file " + name + " has " + std::to_string(size) +
                  " bytes, the manifest says " + std::to_string(info.at("bytes").get<uint64_t>()) +
                  " (truncated or overwritten)");
    if (checksums && crc32c_file(p.string()) != info.at("crc32c").get<uint32_t>())
      throw Error("checkpoint " + folder + ": file " + name +
                  " fails its CRC-32C check (corrupted)");
  }
  return m;
}

std::string read_run_id(const std::string& folder) {
  const nlohmann::json j = read_soft(fs::path(folder) / "trainer.json");
  if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string()) return "";
  return j["run_id"].get<std::string>();
}

std::pair<int64_t, int64_t> read_batch_shape(const std::string& folder) {
  const nlohmann::json j = read_soft(fs::path(folder) / "trainer.json");
  if (!j.is_object() || !j.contains("world_size") || !j["world_size"].is_number_integer() ||
      !j.contains("shape") || !j["shape"].is_object() || !j["shape"].contains("global_rows") ||
      !j["shape"]["global_rows"].is_number_integer())
    return {0, 0};
  return {j["shape"]["global_rows"].get<int64_t>(), j["world_size"].get<int64_t>()};
}

}  // namespace ciuic::checkpoint
