// ciuic::Config — typed, located access to one validated recipe section.
#include "config_impl.h"

#include "toml_format.h"

#include <sstream>

#include <ciuic/error.h>

namespace ciuic {

Config::Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Config Config::from_toml(std::string_view section, std::string_view toml_text,
                         std::string_view origin) {
  auto impl = std::make_shared<Impl>();
  impl->section = std::string(section);
  impl->origin = std::string(origin);
  try {
    impl->table = toml::parse(toml_text, std::string(origin));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw UsageError(std::string(origin) + ":" + std::to_string(b.line) + ":" +
                     std::to_string(b.column) + ": " + std::string(e.description()));
  }
  for (auto&& [k, v] : impl->table)
    impl->locations[std::string(k.str())] = toml_location(v, impl->origin);
  return Config(std::move(impl));
}

const std::string& Config::section() const { return impl_->section; }

bool Config::has(std::string_view key) const { return impl_->table.contains(key); }

std::vector<std::string> Config::keys() const {
  std::vector<std::string> out;
  for (auto&& [k, v] : impl_->table) out.emplace_back(k.str());
  return out;
}

namespace {
[[noreturn]] void bad_access(const Config& c, std::string_view key, const char* want) {
  throw Error("internal error: [" + c.section() + "] " + std::string(key) + " read as " + want +
              (c.has(key) ? " but holds another type" : " but is absent") +
              " (a plugin read an option it did not declare?)");
}
}  // namespace

bool Config::get_bool(std::string_view key) const {
  auto v = impl_->table[key].value_exact<bool>();
  if (!v) bad_access(*this, key, "bool");
  return *v;
}

int64_t Config::get_int(std::string_view key) const {
  auto v = impl_->table[key].value_exact<int64_t>();
  if (!v) bad_access(*this, key, "integer");
  return *v;
}

double Config::get_float(std::string_view key) const {
  const toml::node* n = impl_->table.get(key);
  if (n) {
    if (auto f = n->value_exact<double>()) return *f;
    if (auto i = n->value_exact<int64_t>()) return static_cast<double>(*i);
  }
  bad_access(*this, key, "float");
}

std::string Config::get_string(std::string_view key) const {
  auto v = impl_->table[key].value_exact<std::string>();
  if (!v) bad_access(*this, key, "string");
  return *v;
}

std::vector<std::string> Config::get_string_list(std::string_view key) const {
  const toml::array* a = impl_->table[key].as_array();
  if (!a) bad_access(*this, key, "string list");
  std::vector<std::string> out;
  for (const auto& e : *a) {
    auto s = e.value_exact<std::string>();
    if (!s) bad_access(*this, key, "string list");
    out.push_back(*s);
  }
  return out;
}

std::vector<double> Config::get_float_list(std::string_view key) const {
  const toml::array* a = impl_->table[key].as_array();
  if (!a) bad_access(*this, key, "float list");
  std::vector<double> out;
  for (const auto& e : *a) {
    if (auto f = e.value_exact<double>())
      out.push_back(*f);
    else if (auto i = e.value_exact<int64_t>())
      out.push_back(static_cast<double>(*i));
    else
      bad_access(*this, key, "float list");
  }
  return out;
}

std::string Config::location(std::string_view key) const {
  auto it = impl_->locations.find(key);
  if (it != impl_->locations.end()) return it->second;
  return impl_->origin;
}

std::string Config::to_toml() const {
  std::ostringstream os;
  os << toml::toml_formatter(impl_->table);
  return os.str();
}

void Config::fail(std::string_view key, std::string_view what) const {
  std::ostringstream os;
  os << location(key) << ": [" << impl_->section << "] " << key;
  if (const toml::node* n = impl_->table.get(key)) os << " = " << format_value(*n);
  os << ": " << what;
  throw UsageError(os.str());
}

}  // namespace ciuic
