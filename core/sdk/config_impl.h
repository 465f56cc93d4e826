// SDK-internal (not installed): the data behind ciuic::Config (a validated recipe section),
// built by the engine's recipe loader, which includes this as "sdk/config_impl.h".
#pragma once

#include <map>
#include <string>

#include <toml++/toml.h>

#include <ciuic/config.h>

namespace ciuic {

class Config::Impl {
 public:
  std::string section;  // e.g. "sharding", "model.config"
  toml::table table;    // the section's values (defaults filled in when validated)
  // key -> "<file>:<line>:<col>", "--set", or "<default>"; keys without an entry use `origin`.
  std::map<std::string, std::string, std::less<>> locations;
  std::string origin;  // file the section came from (for keys without a location)
};

}  // namespace ciuic
