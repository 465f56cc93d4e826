// Internal: what `ciuic-run` does, behind its argument parsing (apps/ciuic-run/main.cpp).
//
// The app parses the command line into CliOptions and calls one of the functions below; they
// throw ciuic::Error (exit code inside) on failure and return the process exit code otherwise.
// Output: results on stdout (listings, --print-recipe, the dry-run summary), problems on stderr.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {
class Registry;
class Recipe;
}  // namespace ciuic

namespace ciuic::app {

struct CliOptions {
  std::string recipe;                     // RECIPE (required for a run)
  std::vector<std::string> overrides;     // --set section.key=value, in order
  std::vector<std::string> plugin_paths;  // --plugin-path DIR, in order
  std::optional<int> nproc;               // --nproc: [cluster] nproc_per_node
  std::optional<int> nnodes;              // --nnodes: [cluster] nnodes
  int node_rank = 0;                      // --node-rank
  std::string master_addr = "127.0.0.1";  // --master-addr
  int master_port = 0;                    // --master-port (0: a free port, single node)
  bool output_all_ranks = false;          // --output-all-ranks: [cluster] output = "all"
  std::string resume;                     // --resume PATH|latest|auto
  bool overwrite = false;                 // --overwrite (checkpoint/run_dir.h)
  bool dry_run = false;                   // --dry-run
  bool print_recipe = false;              // --print-recipe
  bool plan = false;                      // --plan
  std::vector<std::string> argv;          // this process's command line (workers rerun it)
};

// The overrides a run applies: --set ones, then those implied by --nproc, --nnodes and
// --output-all-ranks (which therefore win).
CIUIC_API std::vector<std::string> effective_overrides(const CliOptions& options);

// RECIPE [...]: load, validate, then print (--print-recipe), estimate memory per rank (--plan,
// train/plan.h; exit 0), check by instantiating every plugin once (--dry-run), or train (as a
// worker, single-process, or as the launcher of the workers).
CIUIC_API int run_recipe(const CliOptions& options);

// --list-plugins [--verbose]: one line per plugin "<slot> <name> <version> <path>"; verbose adds
// the summary and every option (key, default, type, help), the search path and shadowed files.
// Refused files are listed on `err`. Returns 0.
CIUIC_API int list_plugins(const Registry& registry, bool verbose, std::ostream& out,
                           std::ostream& err);

// The plugin search path for a run: --plugin-path folders, then [run] plugin_paths resolved
// against the recipe's folder (Registry::discover adds the default folders in front).
CIUIC_API std::vector<std::string> plugin_paths(const CliOptions& options, const Recipe* recipe);

// --export-hf CKPT OUT [--export-dtype bf16|fp32] [--tokenizer FILE]: writes a Hugging Face
// folder (config.json, model*.safetensors, generation_config.json, the tokenizer files) from a
// checkpoint folder, or the newest complete checkpoint under a checkpoint dir, whatever world size
// wrote it. Checksums are verified first. OUT must not exist or be empty; the folder is assembled
// next to it and renamed into place, so a failed export leaves nothing half-written. FILE is a
// tokenizer.json (its sibling tokenizer_config.json is copied too). Throws UsageError on a bad
// argument, Error on a corrupt checkpoint or an I/O failure. Prints what it wrote on `out`.
// A LoRA checkpoint exports as a PEFT adapter folder (adapter_config.json,
// adapter_model.safetensors); with `merge`, as the base model (its folder from the adapter
// config's base_model_name_or_path) with the adapter merged in. `merge` on a full checkpoint is
// a UsageError.
CIUIC_API int export_hf(const std::string& checkpoint, const std::string& out_dir,
                        const std::string& dtype, const std::string& tokenizer, std::ostream& out,
                        bool merge = false);

// --from-deepspeed FILE [--set section.key=value]... [-o OUT]: translates a DeepSpeed config into
// an equivalent recipe (import/deepspeed.h, docs/deepspeed.md), written to OUT or `out`. The keys
// without a ciuic meaning, the notes and the placeholders are listed on `err` (and as comments in
// the recipe). `overrides` are recipe keys (effective_overrides: --nproc/--nnodes give the world
// size). "auto" values take the HF Trainer's (TrainingArguments defaults) or ciuic's answer, each
// said on its line. Throws UsageError (exit 2) for unsupported features and bad values.
CIUIC_API int from_deepspeed(const std::string& config, const std::vector<std::string>& overrides,
                             const std::string& out_path, std::ostream& out, std::ostream& err);

// --from-llamafactory FILE / --from-axolotl FILE [--set ...]... [-o OUT]: translates a training
// file (import/training_file.h, docs/migrate.md), and the DeepSpeed config it names, into a recipe,
// written like --from-deepspeed's. The datasets it names are converted into ciuic's JSONL in
// OUT's stem + "-data/" (next to OUT), or ./ciuic-data/ when the recipe goes to `out`; their files
// are listed on `err`. `tool` is "llamafactory" or "axolotl".
CIUIC_API int from_training_file(const std::string& tool, const std::string& file,
                                 const std::vector<std::string>& overrides,
                                 const std::string& out_path, std::ostream& out, std::ostream& err);

// --plot RUN_DIR: writes RUN_DIR/report.html (report/html_report.h) from RUN_DIR/metrics.jsonl (or
// from the metrics file given instead of a folder) and prints its path. Also during the run.
CIUIC_API int plot(const std::string& run_dir, std::ostream& out);

// --watch RUN_DIR [--interval S]: the live per-rank table of a run (report/watch.h), redrawn in
// place when `out` is a terminal (`tty`), until the run ends. Whether the run is still going is
// read from the run folder's lock (checkpoint/run_dir.h: the holder's pid, on this host). Returns
// 0 when the run ended, 1 when it stopped without its end record; UsageError when no run appears.
CIUIC_API int watch(const std::string& run_dir, double interval_s, bool tty, std::ostream& out);

// --version: ciuic version, LibTorch version, build fingerprint, plugin API version.
CIUIC_API std::string version_text();
// Short list of the recipe sections (for --help) and the full key reference (--help-recipe).
CIUIC_API std::string recipe_sections_text();
CIUIC_API std::string recipe_reference_text();

}  // namespace ciuic::app
