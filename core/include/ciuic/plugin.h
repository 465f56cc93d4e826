// ciuic/plugin.h — the plugin ABI: how a shared library becomes a ciuic plugin.
//
// Modelled on LLVM's PassPlugin.h: a plugin exports one C-linkage entry point returning a plain,
// static info record, and a factory. The loader (core/src/registry) dlopens the library, reads the
// info record FIRST, and refuses — naming the file, what it expected and what it found — any
// plugin whose api_version or build fingerprint differs from the core's. A refused plugin's
// factory is never called. (Static initialisers of the library run at dlopen time, as with every
// shared library; plugins must keep them free of side effects.)
//
// A plugin source file looks like this (see examples/hello_plugin and docs/plugins.md):
//
//   #define CIUIC_PLUGIN_API 9  // the plugin API this source is written for, before any include
//   #include <ciuic/config.h>
//   #include <ciuic/plugin.h>
//   #include <ciuic/precision.h>
//   namespace {
//   constexpr ciuic::Option<double> kLossScale{"loss_scale", "1.0", "static loss scale", 0.0, 1e9};
//   const ciuic::OptionSpec kOptions[] = {kLossScale};
//   class MyPolicy : public ciuic::Precision {  // reads cfg.get(kLossScale)
//     ...
//   };
//   }
//   CIUIC_DEFINE_PLUGIN(ciuic::Slot::kPrecision, "mine", "1.0.0", "my precision policy",
//                       kOptions, [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
//                         return new MyPolicy(a.config, a.context); })
//
// Ownership: the factory returns a new-allocated object; the core owns it and deletes it through
// the virtual destructor while the library is still loaded (the core keeps every plugin library
// loaded until process exit). Threading: info and factory are called from the main thread only.
// Failure: the factory reports bad options or set-up failures by throwing ciuic::UsageError /
// ciuic::Error; the core adds the plugin's name and file to the message.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/version.h>  // TORCH_VERSION, for the build fingerprint

#include <boost/dll/alias.hpp>

#include <ciuic/export.h>
#include <ciuic/metrics.h>

// ---- which API the source was written for -----------------------------------------------------
// A plugin source states the plugin API it was written for: #define CIUIC_PLUGIN_API 9 before
// its first <ciuic/...> include (or -DCIUIC_PLUGIN_API=9). Source written for an older API gets
// an error naming what changed since (below); source that says nothing gets a warning at its
// CIUIC_DEFINE_PLUGIN, since it predates the declaration (API 6 and older). Source written for API
// 7 or 8 compiles unchanged: API 8 and 9 only added virtual functions with defaults (version log).
#if defined(CIUIC_PLUGIN_API)
#if CIUIC_PLUGIN_API > 9
#error \
    "this plugin is written for a newer plugin API than this SDK's (9): build it against a newer ciuic SDK"
#elif CIUIC_PLUGIN_API < 7
#error \
    "this plugin is written for plugin API < 7; API 7 changed (ciuic/plugin.h, version log): the core owns the step - Sharding::step(StepInput) is now finish_grads() + update(OptimizerStep), begin_step and StepInput/StepResult are gone (the core offers Optimizer::offer_early_update); Sharding::before_group/after_group; Sharding::load_state(fetch, t) and Optimizer::write_params(out, t); Precision::round_to_param(master, out, t, positions) with global positions; Precision::skipped_steps removed, Precision has fp32 defaults; DataOpenArgs lost seed/rank/world_size (use the RunContext). Port it, then define CIUIC_PLUGIN_API 7"
#endif
#define CIUIC_PLUGIN_API_NOTE_
#else
// _Pragma takes one string literal: clang-format would split it.
// clang-format off
#define CIUIC_PLUGIN_API_NOTE_ \
  _Pragma("GCC warning \"this plugin source does not say which plugin API it was written for (#define CIUIC_PLUGIN_API 9 before its includes): it predates API 7, which changed Sharding::step into finish_grads() + update(), removed Sharding::begin_step, StepInput/StepResult and Precision::skipped_steps, gave round_to_param(master, out, t, positions) global positions, added t to Sharding::load_state and Optimizer::write_params, and moved seed/rank/world_size from DataOpenArgs to the RunContext (ciuic/plugin.h, version log)\"")
// clang-format on
#endif

namespace ciuic {

class Config;
struct RunContext;
struct PlanContext;

// Optional: answers for the plugin's own memory in `ciuic-run --plan` (ciuic/plan.h). Called on
// the main thread with the plugin's validated options, before any plugin object exists; must not
// allocate devices, open files or talk to other ranks.
using PluginPlanFn = void(const Config& options, PlanContext& plan);

// The plugin API version. Like LLVM_PLUGIN_API_VERSION, the loader accepts a plugin only when its
// info record carries exactly this number (and the same build fingerprint, below).
//
// What the number covers: the layout of PluginInfo and OptionSpec, the slot interfaces (the
// classes in comm.h, sharding.h, optimizer.h, precision.h, data.h and the types their methods
// take: their virtual functions, order and signatures), config.h, context.h, plan.h, state.h,
// store.h, tokenizer.h, metrics.h and the SDK's exported functions. Any change to these that a
// compiled plugin would notice (a virtual added, removed or reordered; a member of a struct passed
// across the boundary added, removed or retyped; an exported function removed or changed) bumps it,
// with a line below. What it does not cover: the kits (libciuic_optim_kit.a, libciuic_data_kit.a),
// which are static libraries a plugin carries inside itself — changing them never breaks a
// compiled plugin; and the engine (libciuic), which plugins do not link.
//   1: first release.
//   2: BucketSharding's members changed (then part of the SDK).
//   3: the "offload" slot became "optimizer" (ciuic/optimizer.h: the optimizer owns the gradient
//      shard and receives reduced chunks); Precision::round_to_param; PluginInfo::plan; the
//      bucketed sharding machinery left the SDK for the optim kit.
//   4: Sharding::begin_step and Optimizer::offer_early_update (an optimizer may update regions
//      while backward goes on when the update does not depend on the gradient norm);
//      StepInput::nonfinite_stops.
//   5: OptimizerSetup::grad_dtype and one_chunk_per_step (chunks come in one declared dtype; with
//      one rank in the parameter dtype, unreduced); PlanContext::grad_bytes and one_chunk_per_step.
//   6: OptionSpec::flags (kOptionPlanned: "auto" chosen by the core's memory planner).
//   7: the core owns the step (norm, precision.update, skip, clip; core/src/train/step.h):
//      Sharding::step(StepInput) -> StepResult became finish_grads() -> GradSquares and
//      update(OptimizerStep); StepInput, StepResult and Sharding::begin_step left the ABI (the
//      core offers Optimizer::offer_early_update itself); Sharding::before_group/after_group
//      (layer boundaries, ShardingSetup::groups, GroupPass) for parameter-sharding strategies;
//      Sharding::load_state and Optimizer::write_params take the last applied update's t;
//      Precision::round_to_param(master, out, t, positions) with global PositionSpans
//      (OptimizerSetup::positions) instead of a shard offset; Precision has defaults (fp32, scale
//      1, no check, never skip) and lost skipped_steps(); Sharding::memory, Optimizer::memory,
//      Comm::counters and DataSource::epoch have defaults and are used by the core;
//      DataOpenArgs lost seed, rank and world_size (the RunContext has them); Option<T>.
//   8: Sharding::builds_parameters() (appended after memory(); default false) with
//      ShardingSetup::values: a parameter-sharding strategy gets the
//      model's parameters without memory and materialises only its shard from the values the core
//      hands it (13B on a 24 GiB card); PlanContext::start_bytes (the sharding's peak while the
//      model is built, shown by --plan). Additions with defaults only: source written for API 7
//      compiles unchanged (CIUIC_PLUGIN_API 7 is accepted), compiled API-7 plugins are refused.
//   9: Sharding::shards_parameters() (appended after builds_parameters(); default false),
//      Optimizer::accepts_sharded_parameters() (appended after memory()) and
//      Precision::accepts_sharded_parameters() (appended after load_state()), both default false:
//      the core refuses at start (ciuic::UsageError, exit 2, naming both plugins and their recipe
//      keys) a sharding that shards the parameters themselves (zero3) with an optimizer or
//      precision policy that has not declared that it works with them. Additions with defaults
//      only: source written for API 7 or 8 compiles unchanged (CIUIC_PLUGIN_API 7 and 8 are
//      accepted) and runs as before with ddp, zero2 and any sharding that keeps parameters whole;
//      with zero3 such an optimizer or policy is refused until it says true (a safe default: the
//      core cannot tell whether it holds the model's parameters or reads params_out). Compiled
//      API-8 plugins are refused.
inline constexpr uint32_t kPluginApiVersion = 9;

// The five slots a recipe fills. The numeric values are part of the ABI.
enum class Slot : uint32_t {
  kComm = 0,       // ciuic/comm.h       Comm
  kSharding = 1,   // ciuic/sharding.h   Sharding
  kOptimizer = 2,  // ciuic/optimizer.h  Optimizer
  kPrecision = 3,  // ciuic/precision.h  Precision
  kData = 4,       // ciuic/data.h       DataSource
};
inline constexpr int kNumSlots = 5;

// "comm", "sharding", "optimizer", "precision", "data" (also the recipe section names and the
// <slot> of plugin file names libciuic_<slot>_<name>.so).
CIUIC_API const char* slot_name(Slot slot);

enum class OptionType : uint32_t {
  kBool = 0,
  kInt = 1,    // TOML integer; a float value is an error (never silently truncated)
  kFloat = 2,  // TOML float or integer
  kString = 3,
  kStringList = 4,  // TOML array of strings
  kFloatList = 5,   // TOML array of numbers, e.g. betas = [0.9, 0.999]
};

// One option of a plugin's recipe section. The core validates the section against these before
// the factory runs: unknown keys, wrong types, out-of-range values and missing required options
// are recipe errors with file:line:col. All strings are static and NUL-terminated.
struct OptionSpec {
  const char* key;
  OptionType type;
  // Default as a TOML value literal ("2e8", "true", "\"auto\"", "[]"); nullptr = required.
  const char* default_value;
  const char* help;  // one line, shown by `ciuic-run --list-plugins --verbose`
  // Inclusive range for kInt/kFloat; NAN = unbounded on that side.
  double min = NAN;
  double max = NAN;
  // For kString: allowed values separated by '|', e.g. "auto|nvlink|pcie|shm"; nullptr = any.
  const char* choices = nullptr;
  // kOption* bits below; 0 for an ordinary option.
  uint32_t flags = 0;
};

// A typed option: declared once, listed in the plugin's OptionSpec array (it converts to its
// OptionSpec) and read with Config::get(option) (ciuic/config.h) — the key is written once, so a
// misspelt key cannot be read, and the type read is the type declared. E.g.
//   constexpr ciuic::Option<int64_t> kThreads{"threads", "0", "worker threads (0: all cores)", 0,
//   1024}; const ciuic::OptionSpec kOptions[] = {kThreads, ...};   ...   cfg.get(kThreads)
// T: bool, int64_t, double, std::string, std::vector<std::string> or std::vector<double>.
template <class T>
struct OptionTypeOf;
template <>
struct OptionTypeOf<bool> {
  static constexpr OptionType value = OptionType::kBool;
};
template <>
struct OptionTypeOf<int64_t> {
  static constexpr OptionType value = OptionType::kInt;
};
template <>
struct OptionTypeOf<double> {
  static constexpr OptionType value = OptionType::kFloat;
};
template <>
struct OptionTypeOf<std::string> {
  static constexpr OptionType value = OptionType::kString;
};
template <>
struct OptionTypeOf<std::vector<std::string>> {
  static constexpr OptionType value = OptionType::kStringList;
};
template <>
struct OptionTypeOf<std::vector<double>> {
  static constexpr OptionType value = OptionType::kFloatList;
};

template <class T>
struct Option {
  OptionSpec spec;
  // The OptionSpec fields after `type` (which T decides).
  constexpr Option(const char* key, const char* default_value, const char* help, double min = NAN,
                   double max = NAN, const char* choices = nullptr, uint32_t flags = 0)
      : spec{key, OptionTypeOf<T>::value, default_value, help, min, max, choices, flags} {}
  constexpr operator OptionSpec() const { return spec; }  // NOLINT: listed in OptionSpec arrays
  constexpr const char* key() const { return spec.key; }
};

// OptionSpec::flags: the option is chosen by the core's memory planner. Only for a kString option
// whose choices are "auto|<first>|<second>|..." (at least two after "auto"; the registry refuses
// the plugin otherwise). When the recipe says "auto" (or leaves the option at an "auto" default),
// the core replaces it before the plugin sees its Config (factory and plan function alike) with the
// first of the later choices whose memory plan (the plugin's own plan function, ciuic/plan.h, with
// the model's leanest "auto" settings) fits plan::kAutoMemoryFraction of [cluster]
// memory_per_device_gib, else of the device's memory; the last choice when none fits, and in
// `--plan` without a cap. So list the choices from the one to prefer to the leanest, and count each
// in the plan function. The choice is logged; every rank makes the same one. A plugin never sees
// "auto" in such an option. E.g. zero2's grad_accumulation = "auto|no_sync|reduce_each".
// Also for a kInt option with a finite range min < max: the recipe may then write "auto" besides an
// integer, and the core chooses the largest value in [min, max] whose plan fits (min when none
// does, and in `--plan` without a cap), searching by bisection: the plugin's plan must not shrink
// as the value grows. E.g. zero2's local_accumulation_percent.
inline constexpr uint32_t kOptionPlanned = 1u << 0;

// The record returned by the info entry point. Plain data with static storage duration.
struct PluginInfo {
  uint32_t api_version;  // must equal the core's kPluginApiVersion
  Slot slot;
  const char* name;               // e.g. zero2; unique within its slot
  const char* version;            // the plugin's own version, e.g. "1.0.0"
  const char* summary;            // one line
  const char* build_fingerprint;  // CIUIC_BUILD_FINGERPRINT as seen when the plugin was compiled
  const OptionSpec* options;
  uint32_t num_options;
  PluginPlanFn* plan;  // may be null: the planner then says it cannot count this plugin
};

// Base of every object a plugin creates. Non-copyable; destroyed by the core.
class CIUIC_API PluginObject {
 public:
  PluginObject() = default;
  PluginObject(const PluginObject&) = delete;
  PluginObject& operator=(const PluginObject&) = delete;
  virtual ~PluginObject();

  // Adds this object's counters (bytes moved, time spent, memory held, ...) to a metrics record.
  // Called on the main thread at logged steps; must be cheap. Default: nothing.
  virtual void append_metrics(Metrics& out) const;
};

// What the factory gets: the plugin's validated recipe section and the run context. Both outlive
// the created object.
struct PluginArgs {
  const Config& config;
  const RunContext& context;
};

using PluginInfoFn = const PluginInfo*();
using PluginFactoryFn = PluginObject*(const PluginArgs&);

// Names of the two exported entry points (Boost.DLL aliases).
inline constexpr const char* kPluginInfoSymbol = "ciuic_plugin_info";
inline constexpr const char* kPluginFactorySymbol = "ciuic_plugin_create";

// The core's own fingerprint (what a plugin's must equal), e.g.
// "torch=2.11.0;cxx11abi=1;compiler=gnu".
CIUIC_API const char* core_build_fingerprint();

}  // namespace ciuic

#define CIUIC_STR_IMPL_(x) #x
#define CIUIC_STR_(x) CIUIC_STR_IMPL_(x)
#if defined(__clang__)
#define CIUIC_COMPILER_FAMILY_ "clang"
#elif defined(__GNUC__)
#define CIUIC_COMPILER_FAMILY_ "gnu"
#else
#define CIUIC_COMPILER_FAMILY_ "unknown"
#endif
// What must agree between the core and a plugin for C++ objects (at::Tensor, std::string, ...) to
// cross the boundary: the LibTorch version, the libstdc++ dual-ABI flag and the compiler family.
#define CIUIC_BUILD_FINGERPRINT \
  "torch=" TORCH_VERSION        \
  ";cxx11abi=" CIUIC_STR_(_GLIBCXX_USE_CXX11_ABI) ";compiler=" CIUIC_COMPILER_FAMILY_

// Defines and exports the two entry points. Use once per plugin library, at namespace scope.
// OPTIONS is an array of ciuic::OptionSpec (or use CIUIC_DEFINE_PLUGIN_NO_OPTIONS); PLAN a
// ciuic::PluginPlanFn (CIUIC_DEFINE_PLUGIN_PLANNED) or none.
#define CIUIC_DEFINE_PLUGIN_IMPL_(SLOT, NAME, VERSION, SUMMARY, OPTS, NOPTS, FACTORY, PLAN)  \
  CIUIC_PLUGIN_API_NOTE_                                                                     \
  namespace ciuic_plugin_entry_ {                                                            \
  const ::ciuic::PluginInfo* info() {                                                        \
    static const ::ciuic::PluginInfo kInfo{                                                  \
        ::ciuic::kPluginApiVersion, SLOT, NAME,  VERSION, SUMMARY,                           \
        CIUIC_BUILD_FINGERPRINT,    OPTS, NOPTS, PLAN};                                      \
    return &kInfo;                                                                           \
  }                                                                                          \
  ::ciuic::PluginObject* create(const ::ciuic::PluginArgs& args) { return (FACTORY)(args); } \
  }                                                                                          \
  BOOST_DLL_ALIAS(ciuic_plugin_entry_::info, ciuic_plugin_info)                              \
  BOOST_DLL_ALIAS(ciuic_plugin_entry_::create, ciuic_plugin_create)

#define CIUIC_OPTION_COUNT_(OPTIONS) \
  static_cast<uint32_t>(sizeof(OPTIONS) / sizeof(::ciuic::OptionSpec))

#define CIUIC_DEFINE_PLUGIN(SLOT, NAME, VERSION, SUMMARY, OPTIONS, FACTORY)                      \
  CIUIC_DEFINE_PLUGIN_IMPL_(SLOT, NAME, VERSION, SUMMARY, OPTIONS, CIUIC_OPTION_COUNT_(OPTIONS), \
                            FACTORY, nullptr)

#define CIUIC_DEFINE_PLUGIN_PLANNED(SLOT, NAME, VERSION, SUMMARY, OPTIONS, FACTORY, PLAN)        \
  CIUIC_DEFINE_PLUGIN_IMPL_(SLOT, NAME, VERSION, SUMMARY, OPTIONS, CIUIC_OPTION_COUNT_(OPTIONS), \
                            FACTORY, PLAN)

#define CIUIC_DEFINE_PLUGIN_NO_OPTIONS(SLOT, NAME, VERSION, SUMMARY, FACTORY) \
  CIUIC_DEFINE_PLUGIN_IMPL_(SLOT, NAME, VERSION, SUMMARY, nullptr, 0, FACTORY, nullptr)

#define CIUIC_DEFINE_PLUGIN_NO_OPTIONS_PLANNED(SLOT, NAME, VERSION, SUMMARY, FACTORY, PLAN) \
  CIUIC_DEFINE_PLUGIN_IMPL_(SLOT, NAME, VERSION, SUMMARY, nullptr, 0, FACTORY, PLAN)
