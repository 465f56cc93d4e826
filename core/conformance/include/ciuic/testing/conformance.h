// ciuic/testing/conformance.h — the conformance kit: a plugin .so against its slot's contract.
//
// For plugin authors (docs/plugins.md, "Testing a plugin"). Installed with the SDK as
// libciuic_conformance.so (CMake: ciuic::conformance, when GoogleTest is found) and as the
// program `ciuic-plugin-check PLUGIN.so`, which runs the same checks. The library links the engine
// (libciuic) for the real plugin loader; a plugin never links it.
//
//   TEST(MyComm, Conforms) {
//     auto p = ciuic::conformance::PluginUnderTest::load("build/plugins/libciuic_comm_mine.so");
//     ciuic::conformance::CheckOptions o;
//     o.options_toml = "threads = 2\n";
//     ciuic::conformance::check_plugin(p, o);      // the slot's checks, GoogleTest failures
//   }
//
// What each check holds the plugin to (the references are computed in the check, never by the
// plugin; every rule is the one its slot's header states):
//   comm       every collective the core and the in-tree kits issue, with the dtypes and reduce
//              op they use — all_reduce SUM (fp64: losses, gradient norms; fp32/bf16/fp16:
//              gradient buckets), reduce_scatter SUM and all_gather (out of place and in place)
//              in fp32/bf16/fp16, broadcast from rank 0 and from the last rank, barrier — at
//              every world size of CheckOptions::world_sizes, each rank a process of its own
//              (forked before the check starts any thread; run it before anything else in the
//              process starts threads, e.g. as the first test of its own binary); values exact in
//              every dtype, so results must be exact; random fp32 values within 8 units of
//              rounding; several collectives in flight at once, waited in reverse order;
//              rank()/size()/device(). all_reduce AVG, MAX and MIN in fp32 (the interface's, unused
//              by the core) must be right or throw ciuic::Error naming the operation.
//   data       at world sizes 1..4: batch shapes and dtypes, labels -100 or in [0, vocab),
//              num_label_tokens; the same batches on every open; global dealing (rank k of W
//              reads global rows g + k, g + k + W, ...: the rows at world W are those at world 1);
//              every rank's cursor() equal after the same number of next(); resume on the same
//              world size continues bit for bit; a cursor taken at world A (rank 0's) continues
//              at world B exactly at the next global row, also with another micro-batch size;
//              eval: the same number of batches on every rank, begin_eval() restarts, eval rows
//              dealt globally as well. The check reads CheckOptions::rows global rows: the data
//              set must hold at least that many training rows per epoch.
//   precision  dtypes; round_to_param: the same bits however the elements are cut into calls
//              and spans (the same global positions and t), round to nearest even when
//              rounds_to_nearest() says so, otherwise noise that varies with t and is unbiased
//              (the mean of 400 roundings within 6 standard errors of the value);
//              loss_scale() changes only inside update(); a finite step is never
//              skipped; without an overflow check the scale stays put (CheckOptions::expect_scale
//              pins its value: fp32 and bf16 1); with one, an overflow skips the step and never
//              raises the scale, repeated overflows lower it, finite steps raise it periodically
//              (CheckOptions::expect_backoff/growth/window pin the factors and the window: fp16
//              halves on an overflow and doubles after loss_scale_window good steps), an
//              exhausted scale ends in ciuic::Error naming the step; save_state/load_state: a
//              restored policy decides exactly as the original, step for step. With
//              accepts_sharded_parameters() true (API 9): the same bits for spans whose global
//              positions do not ascend, padding between them (a zero3 shard's order).
//   optimizer  the protocol of ciuic/optimizer.h on the CPU with the installed fp32 precision
//              plugin: state_names() starts with "master", finish_grads() is the sum of squares
//              of the accumulated gradient (chunks over several micro-batches, regions in any
//              order), params_out and the master after each step, save/load + write_params
//              resumes bit for bit; with accepts_sharded_parameters() true (API 9), the same
//              bits with params_out a new tensor of NaNs at every step() and write_params() and
//              the initial values overwritten after setup(); CheckOptions::reference = "adamw":
//              the updates equal
//              torch's AdamW (decoupled weight decay; betas and eps from the plugin's options
//              `betas`, `eps` when it has them), computed independently in fp64.
//   sharding   the protocol of ciuic/sharding.h driven as the trainer drives it, on the engine's
//              decoder model (tiny, fp32, CPU; untied, and tied with activation checkpointing, so a
//              parameter sits in two groups and kRecompute boundaries come) with the installed
//              gloo, fp32 and adamw plugins, each rank a forked process, at every world size of
//              CheckOptions::world_sizes: micro-batches (accumulation 2), the model's layer
//              boundaries, finish_grads() -> global norm -> clipping (it bites) -> update(); every
//              parameter, read inside its groups' kForward boundaries (where a parameter-sharding
//              plugin gathers it), after setup() and after each step equals the reference — one
//              process, the whole global batch, plain autograd, AdamW in fp64 — to 1e-4
//              relative; the state saved after step 2 (layout() + save_state()) and loaded with
//              load_state() into fresh plugins of the next world size in the list makes the
//              parameters of step 2 again and goes on to the reference's.
//
// Threading: main thread; the comm check forks. Failure: GoogleTest failures (ADD_FAILURE /
// EXPECT_*) naming the world size, rank, collective or step; load() and config() throw
// ciuic::UsageError naming the file or option, as ciuic-run would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/export.h>
#include <ciuic/plugin.h>

namespace ciuic::conformance {

// One plugin library loaded by the real registry (the rules of ciuic-run: API version, build
// fingerprint, entry points, option declarations), plus the registry's default search path, from
// which the checks take helper plugins (the fp32 precision plugin for an optimizer).
class CIUIC_API PluginUnderTest {
 public:
  // Throws ciuic::UsageError "<path>: <why it was refused>" when the registry refuses the file,
  // or when `path` is not a plugin file.
  static PluginUnderTest load(const std::string& path);

  Slot slot() const;
  const std::string& name() const;
  const std::string& path() const;
  const PluginInfo& info() const;

  // The plugin's recipe section from `options_toml` (its keys without `plugin = ...`), validated
  // against its declared options exactly as ciuic-run validates a recipe: defaults filled in,
  // every problem a ciuic::UsageError naming the key.
  Config config(const std::string& options_toml) const;
  // The object from the plugin's factory (the registry's create: errors get the plugin's name in
  // front). `context` must outlive the object.
  std::shared_ptr<PluginObject> create(const Config& config, const RunContext& context) const;
  // A plugin of the default search path (e.g. Slot::kPrecision, "fp32"), with `options_toml`.
  std::shared_ptr<PluginObject> create_helper(Slot slot, const std::string& name,
                                              const std::string& options_toml,
                                              const RunContext& context) const;

  struct Impl;

 private:
  explicit PluginUnderTest(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

struct CheckOptions {
  std::string options_toml;  // the plugin's section (without `plugin = ...`)
  std::vector<int> world_sizes{1, 2, 3, 4};
  std::string work_dir;           // RunContext::output_dir of the checks; "" = a fresh temp dir
  c10::Device device{c10::kCPU};  // RunContext::device of comm and data checks
  // data
  std::string tokenizer_json;  // the run's tokenizer (a tokenizer.json); "" = none
  int64_t seq_len = 32;
  int64_t micro_batch = 2;
  int64_t rows = 48;  // global training rows read at world 1
  uint64_t seed = 1234;
  // precision
  std::optional<double> expect_scale;  // without an overflow check: the fixed loss scale
  std::optional<double> expect_backoff,
      expect_growth;                     // with one: scale factor on an overflow, on growth
  std::optional<int64_t> expect_window;  // good steps from an overflow to a growth
  // optimizer
  std::string reference;  // "adamw", or "" (protocol checks only)
};

// A RunContext for rank `rank` of `world_size` on `device` with `store` (never null) and
// `output_dir` (created), seed from `options`.
CIUIC_API RunContext make_context(int rank, int world_size, std::shared_ptr<Store> store,
                                  c10::Device device, const std::string& output_dir, uint64_t seed);

// The slot's checks (above) with GoogleTest assertions: call them inside a TEST.
CIUIC_API void check_comm(const PluginUnderTest& plugin, const CheckOptions& options);
CIUIC_API void check_data(const PluginUnderTest& plugin, const CheckOptions& options);
CIUIC_API void check_precision(const PluginUnderTest& plugin, const CheckOptions& options);
CIUIC_API void check_optimizer(const PluginUnderTest& plugin, const CheckOptions& options);
CIUIC_API void check_sharding(const PluginUnderTest& plugin, const CheckOptions& options);
// The check of plugin.slot(); a slot without one is a GoogleTest failure saying so.
CIUIC_API void check_plugin(const PluginUnderTest& plugin, const CheckOptions& options);

}  // namespace ciuic::conformance
