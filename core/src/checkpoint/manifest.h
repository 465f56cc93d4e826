// Internal: a checkpoint folder's JSON read without LibTorch — manifest.json (verify) and the
// trainer.json fields a run reads before it builds anything (run id, batch shape). Split from
// checkpoint.cpp so that the fuzz target for them (tests/fuzz/manifest_fuzz.cpp) compiles these
// sources alone; checkpoint.h includes this header, and the folder format is described there.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace ciuic::checkpoint {

// manifest.json's "format" and "version", as save() writes them and verify() requires them.
inline constexpr const char* kManifestFormat = "ciuic-checkpoint";
inline constexpr int kManifestVersion = 1;

// A JSON file of a checkpoint; Error naming it when it cannot be read or is not JSON.
nlohmann::json read_json(const std::filesystem::path& p);

// Reads and checks manifest.json; with `checksums`, also every file's CRC-32C (sizes are always
// checked). Throws Error naming the folder and the file at fault.
nlohmann::json verify(const std::string& folder, bool checksums);

// The run id in a checkpoint folder's trainer.json; "" when it has none or cannot be read.
std::string read_run_id(const std::string& folder);

// The global batch (rows per optimizer step over all ranks) and the world size a checkpoint
// folder was written with, from its trainer.json; {0, 0} when it cannot be read.
std::pair<int64_t, int64_t> read_batch_shape(const std::string& folder);

}  // namespace ciuic::checkpoint
