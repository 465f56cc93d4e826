// PluginUnderTest (ciuic/testing/conformance.h): the registry's loader and the recipe's option
// validation, behind the installed header.
#include <filesystem>

#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/testing/conformance.h>

#include "base/paths.h"
#include "recipe/recipe.h"
#include "registry/registry.h"

namespace fs = std::filesystem;

namespace ciuic::conformance {

struct PluginUnderTest::Impl {
  Registry registry;
  PluginDescriptor desc;
};

PluginUnderTest::PluginUnderTest(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

PluginUnderTest PluginUnderTest::load(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw UsageError(path + ": no such plugin file");
  const std::string file = fs::path(path).filename().string();
  // The default search path first, the file last: it wins over an installed plugin of its name.
  Registry registry = Registry::discover({path});
  const std::string canon = fs::weakly_canonical(path, ec).string();
  for (const auto& d : registry.list())
    if (fs::weakly_canonical(d.path, ec).string() == canon)
      return PluginUnderTest(std::make_shared<const Impl>(Impl{registry, d}));
  for (const auto& r : registry.refusals())
    if (r.rfind(path + ": ", 0) == 0) throw UsageError(r);
  throw UsageError(path +
                   ": not loaded as a plugin (expected a file named libciuic_<slot>_<name>.so "
                   "defined with CIUIC_DEFINE_PLUGIN)");
}

Slot PluginUnderTest::slot() const { return impl_->desc.slot; }
const std::string& PluginUnderTest::name() const { return impl_->desc.name; }
const std::string& PluginUnderTest::path() const { return impl_->desc.path; }
const PluginInfo& PluginUnderTest::info() const { return *impl_->desc.info; }

namespace {

// The recipe whose [<slot>] section is `options_toml` for plugin `name`, plus what every recipe
// must hold ([train] max_steps, a [data] plugin); the other slots' sections are left out.
Config section_config(Slot slot, const std::string& name, const PluginInfo& info,
                      const std::string& options_toml) {
  const std::string s = slot_name(slot);
  std::string text =
      "[" + s + "]\n" + options_toml + "\nplugin = \"" + name + "\"\n[train]\nmax_steps = 1\n";
  if (slot != Slot::kData) text += "[data]\nplugin = \"-\"\n";
  const Recipe recipe = Recipe::parse(text, "--options ([" + s + "] on line 1)");
  return recipe.plugin_config(slot, info);
}

}  // namespace

Config PluginUnderTest::config(const std::string& options_toml) const {
  return section_config(slot(), name(), info(), options_toml);
}

std::shared_ptr<PluginObject> PluginUnderTest::create(const Config& config,
                                                      const RunContext& context) const {
  return impl_->registry.create_object(slot(), name(), config, context);
}

std::shared_ptr<PluginObject> PluginUnderTest::create_helper(Slot slot, const std::string& name,
                                                             const std::string& options_toml,
                                                             const RunContext& context) const {
  const PluginDescriptor& d = impl_->registry.get(slot, name);
  return impl_->registry.create_object(slot, name,
                                       section_config(slot, name, *d.info, options_toml), context);
}

RunContext make_context(int rank, int world_size, std::shared_ptr<Store> store, c10::Device device,
                        const std::string& output_dir, uint64_t seed) {
  RunContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.local_rank = rank;
  ctx.local_world_size = world_size;
  ctx.device = device;
  ctx.store = std::move(store);
  ctx.timeout = ctx.store->timeout();
  ctx.run_name = "conformance";
  ctx.output_dir = output_dir;
  ctx.recipe_dir = fs::current_path().string();
  ctx.seed = seed;
  paths::create_folders(output_dir, "the checks' output folder (--work-dir)");
  return ctx;
}

void check_plugin(const PluginUnderTest& plugin, const CheckOptions& o) {
  switch (plugin.slot()) {
    case Slot::kComm: return check_comm(plugin, o);
    case Slot::kData: return check_data(plugin, o);
    case Slot::kPrecision: return check_precision(plugin, o);
    case Slot::kOptimizer: return check_optimizer(plugin, o);
    case Slot::kSharding: return check_sharding(plugin, o);
  }
}

}  // namespace ciuic::conformance
