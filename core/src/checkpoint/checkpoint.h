// Internal: checkpoints — save, find, verify, resume on any world size, export to Hugging Face.
//
// A checkpoint is a folder <dir>/step_<00000123> holding
//   rank_<r>.safetensors   one per rank: its shard of the fp32 master weights and AdamW moments
//                          ("master", "exp_avg", "exp_avg_sq"), its RNG state, and in the file's
//                          metadata the shard layout (which elements of which parameter each shard
//                          element is: Sharding::layout()). Together the files hold every
//                          parameter's state exactly once, whatever the world size that wrote them.
//   precision.safetensors  the loss scaler's state (rank 0's; identical on every rank)
//   tokenizer.json, tokenizer_config.json, chat_template.jinja
//                          the run's tokenizer files when it has a tokenizer (rank 0 copies them)
//   trainer.json           step counters, tokens seen, every rank's data cursor, the run's shape
//                          (model config, global batch, sequence length), each parameter's
//                          name and shape, and the run id (below)
//   manifest.json          written LAST: every file with its size and CRC-32C
// The folder is assembled as <dir>/.tmp-step_<n> and renamed into place only once every rank has
// written and checksummed its file, so a folder named step_* is always complete; a crash at any
// point leaves at worst a .tmp-* folder, which is ignored and removed by the next save. Old
// checkpoints are pruned (keep_last) only after the new one is in place.
//
// Run lineage: a fresh run gets a new run id; a resumed run inherits the id of the checkpoint it
// resumed (a checkpoint without one, written before ids existed, gives a new id). Pruning removes
// only checkpoints of this lineage — same run id, at most the step just saved — and never
// another run's (another or no run id). A run resumed from an earlier checkpoint of its
// checkpoint dir abandons the later ones: load() moves them into <dir>/replaced-<date-time>/
// with a warning, so that "latest" is always this run's newest (never deleted). Re-saving a step
// whose folder exists replaces it when it is of this lineage (or the folder this run resumed
// from) and otherwise moves it into <dir>/replaced-<date-time>/ with a warning. (That another
// run's checkpoints are not in the folder at all is checked before the run starts:
// checkpoint/run_dir.h.)
//
// Resuming on another world size: every rank of the new run reads, for each element of its new
// shard, the matching slice from whichever old rank file holds it (the layouts say where), so a run
// saved on 4 ranks resumes on 3 or 1. The global batch (rows per optimizer step) and the sequence
// length must be unchanged; the data position is then rank 0's cursor (DataSource cursors are
// global positions); on the same world size every rank takes back its own cursor and RNG state.
//
// Collective operations (save, load) must be called by every rank at the same step. Coordination
// goes through the run's Store, so a failure on one rank (disk full, unwritable folder) reaches
// every rank as an Error instead of a hang, and leaves the previous checkpoints untouched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/comm.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

#include "checkpoint/manifest.h"  // verify, read_run_id, read_batch_shape
#include "model/config.h"
#include "model/safetensors.h"

namespace ciuic::checkpoint {

// Counters the trainer restores.
struct TrainerState {
  int64_t step = 0;             // optimizer steps completed
  int64_t updates = 0;          // of those, applied (AdamW's t)
  int64_t skipped = 0;          // skipped steps (overflow / non-finite)
  int64_t nonfinite_skips = 0;  // of those, non-finite gradients outside loss scaling
  double tokens = 0;            // tokens processed
};

// What a checkpoint and the run resuming it must agree on.
struct RunShape {
  model::LlamaConfig model;
  int64_t global_rows = 0;  // sequences per optimizer step over all ranks
  int64_t seq_len = 0;
  // Every parameter's HF name and shape, in model order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  // The run's tokenizer files (model::tokenizer_files), copied into every checkpoint under their
  // own names so that an export from the checkpoint carries them; not compared on resume.
  std::vector<std::string> tokenizer_files;
  // With an adapter: its PEFT adapter_config.json (model::peft_adapter_config; `params` then
  // are the adapter's); null otherwise. An export writes a PEFT folder from it.
  nlohmann::json adapter;
};

// The run's stateful parts.
struct Parts {
  Comm* comm = nullptr;
  Sharding* sharding = nullptr;
  Precision* precision = nullptr;
  DataSource* data = nullptr;
};

class Checkpointer {
 public:
  // dir: where step_* folders go (created when needed). keep_last: complete checkpoints kept
  // (0 = all).
  Checkpointer(std::string dir, int64_t keep_last, const RunContext& ctx);

  const std::string& dir() const { return dir_; }
  // Collective. Writes the checkpoint of `state.step`; returns its folder.
  std::string save(const TrainerState& state, const RunShape& shape, const Parts& parts);
  // Collective. Restores `folder` (a step_* folder) into `parts` after checking it against
  // `shape`; returns the trainer counters.
  TrainerState load(const std::string& folder, const RunShape& shape, const Parts& parts);
  // The newest complete checkpoint folder under dir(), "" when there is none.
  std::string latest() const;
  // The last folder this object saved or loaded ("" if none): for error messages.
  const std::string& last_good() const { return last_good_; }
  // This run's lineage id (new, or inherited from the checkpoint load() restored).
  const std::string& run_id() const { return run_id_; }

 private:
  // True for a checkpoint folder of this run's lineage.
  bool ours(const std::string& folder) const;
  // Rank 0, after load(folder): when `folder` is in dir() and later checkpoints follow it there,
  // moves them into dir()/replaced-<date-time>/ with a warning.
  void set_aside_later(const std::string& folder);

  std::string dir_;
  int64_t keep_last_;
  const RunContext& ctx_;
  int64_t saves_ = 0;
  std::string last_good_;
  std::string run_id_;
  std::string loaded_;  // the folder load() restored
};

// The newest complete checkpoint folder under `dir`; "" when there is none.
std::string latest(const std::string& dir);

// "latest" or a folder → a checkpoint folder. "latest" means the newest complete one under `dir`
// (UsageError when there is none). A folder may also be the checkpoint dir itself (then its
// newest). Errors name `option` (the command-line flag that gave `spec`).
std::string resolve(const std::string& spec, const std::string& dir,
                    const std::string& option = "--resume");

// Reassembles every parameter's full fp32 master weights (in model order, model shapes) from a
// checkpoint written at any world size. CPU tensors.
model::NamedTensors read_master_weights(const std::string& folder);
// The model config stored in a checkpoint.
model::LlamaConfig read_model_config(const std::string& folder);
// The adapter config the checkpoint was written with (RunShape::adapter); null without one.
nlohmann::json read_adapter_config(const std::string& folder);

}  // namespace ciuic::checkpoint
