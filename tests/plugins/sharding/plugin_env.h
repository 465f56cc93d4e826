// The sharding tests' plugins in one process: a registry over the build's plugin folder, a run
// context with a local store, and plugins created with their declared defaults plus a TOML
// section, as the recipe would hand them over. Header-only (sharding_step_test,
// sharding_zero3_test).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/plugin.h>

#include "registry/registry.h"

namespace ciuic_test {

struct Env {
  ciuic::RunContext ctx;
  ciuic::Registry reg = ciuic::Registry::from_paths({CIUIC_PLUGIN_DIR});
  Env() {
    ctx.store = ciuic::make_local_store(std::chrono::seconds(30));
    ctx.output_dir = CIUIC_TEST_TMP;
  }
  template <class T>
  std::shared_ptr<T> make(ciuic::Slot slot, const std::string& name, const std::string& toml = "") {
    return reg.create<T>(slot, name, with_defaults(reg.get(slot, name), toml), ctx);
  }
  // The plugin's defaults plus `toml`, as the recipe would hand them over.
  static ciuic::Config with_defaults(const ciuic::PluginDescriptor& d, const std::string& toml) {
    std::string text;
    for (uint32_t i = 0; i < d.info->num_options; ++i) {
      const auto& o = d.info->options[i];
      if (("\n" + toml).find("\n" + std::string(o.key) + " =") == std::string::npos &&
          o.default_value)
        text += std::string(o.key) + " = " + o.default_value + "\n";
    }
    return ciuic::Config::from_toml(ciuic::slot_name(d.slot), text + toml);
  }
};

}  // namespace ciuic_test
