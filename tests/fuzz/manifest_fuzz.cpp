// tests/fuzz/manifest_fuzz.cpp — what a run reads from a checkpoint folder's JSON before it loads
// any tensor: manifest.json (checkpoint::verify, with and without checksums), trainer.json's run
// id and batch shape (checkpoint/manifest.h), and the batch split of an elastic resume made from
// that shape (train/elastic.h, as train/run.cpp does).
//
// Input: manifest.json, then optionally "\n%%\n" and trainer.json (absent without it). They go
// into a temporary folder next to fixed files a manifest can name: rank_00000.safetensors (19
// bytes), precision.safetensors (empty) and a folder "sub".
// Checks: only ciuic::Error escapes verify() and elastic_split() (with a short, valid UTF-8
// message), nothing escapes read_run_id() and read_batch_shape(); an accepted manifest has the
// format and version 1, and names only plain files of the folder with exactly their size and
// CRC-32C; an elastic split is made only for a checkpoint written with the recipe's batch keys,
// and keeps its global batch.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <ciuic/checksum.h>

#include "checkpoint/manifest.h"
#include "fuzz_common.h"
#include "train/elastic.h"

namespace {

namespace fs = std::filesystem;
using namespace ciuic;

// The temporary folder, removed at exit (a plain array: destroyed strings are not read then).
char g_folder[] = "/tmp/ciuic-fuzz-manifest-XXXXXX";

const std::string& folder() {
  static const std::string d = [] {
    if (!::mkdtemp(g_folder)) fuzz::fail("mkdtemp", "/tmp");
    const fs::path dir(g_folder);
    fuzz::write_file(dir / "rank_00000.safetensors", "rank 0 shard bytes\n");
    fuzz::write_file(dir / "precision.safetensors", "");
    fs::create_directory(dir / "sub");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(g_folder, ec);
    });
    return std::string(g_folder);
  }();
  return d;
}

void check_accepted(const nlohmann::json& m, const fs::path& dir) {
  fuzz::check(m.is_object() && m.value("format", "") == checkpoint::kManifestFormat,
              "accepted without the format");
  fuzz::check(m.at("version") == checkpoint::kManifestVersion, "accepted another version",
              m.at("version").dump());
  for (const auto& [name, info] : m.at("files").items()) {
    fuzz::check(!name.empty() && name != "." && name != ".." &&
                    name.find('/') == std::string::npos && name.find('\0') == std::string::npos,
                "accepted a file name that is not a plain name", name);
    std::error_code ec;
    fuzz::check(fs::is_regular_file(dir / name, ec),
                "accepted a file that is not a file of the folder", name);
    fuzz::check(info.at("bytes").get<uint64_t>() == fs::file_size(dir / name),
                "accepted a wrong size", name);
  }
}

void check_checksums(const nlohmann::json& m, const fs::path& dir) {
  for (const auto& [name, info] : m.at("files").items())
    fuzz::check(info.at("crc32c").get<uint64_t>() == crc32c_file((dir / name).string()),
                "accepted a wrong CRC-32C", name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& f = folder();
  const fs::path dir(f);
  const auto [manifest, trainer] =
      fuzz::split_once(std::string_view(reinterpret_cast<const char*>(data), size), "\n%%\n");
  fuzz::write_file(dir / "manifest.json", manifest);
  std::error_code ec;
  fs::remove(dir / "trainer.json", ec);
  if (!trainer.empty()) fuzz::write_file(dir / "trainer.json", trainer);

  fuzz::expect_ok_or_error(
      [&] { check_accepted(checkpoint::verify(f, /*checksums=*/false), dir); });
  fuzz::expect_ok_or_error([&] {
    const nlohmann::json m = checkpoint::verify(f, /*checksums=*/true);
    check_accepted(m, dir);
    check_checksums(m, dir);
  });
  checkpoint::read_run_id(f);
  const std::pair<int64_t, int64_t> shape = checkpoint::read_batch_shape(f);
  const int64_t rows = shape.first,
                world = shape.second;  // (clang 14 captures no structured bindings)
  // The recipe's micro_batch_size, gradient_accumulation_steps and world size of a few resumes.
  struct Resume {
    int64_t micro, accumulation, world;
  };
  for (const Resume r : {Resume{1, 1, 2}, Resume{4, 2, 3}, Resume{3, 5, 1}}) {
    fuzz::expect_ok_or_error([&] {
      const train::ElasticSplit e =
          train::elastic_split(rows, world, r.micro, r.accumulation, r.world, f);
      if (!e.changed) return;
      fuzz::check(static_cast<__int128>(r.micro) * r.accumulation * world == rows,
                  "elastic split of a checkpoint written with other batch keys", e.message);
      fuzz::check(
          e.split.micro_batch >= 1 && e.split.micro_batch <= r.micro && e.split.accumulation >= 1,
          "elastic split outside the recipe's bounds", e.message);
      fuzz::check(e.split.micro_batch * e.split.accumulation * r.world == rows,
                  "elastic split changed the global batch", e.message);
      fuzz::check_message(e.message);
    });
  }
  return 0;
}
