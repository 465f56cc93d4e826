// Internal: plugin discovery, loading and instantiation (core/src/registry; DESIGN §3).
//
// Discovery scans folders for files named libciuic_<slot>_<name>.so, in this order:
//   1. <folder of the executable>/../lib/ciuic/plugins   (build tree and install prefix alike)
//   2. <folder of libciuic.so>/ciuic/plugins             (the install prefix of the core library,
//                                                         for programs installed elsewhere)
//   3. $CIUIC_PLUGIN_PATH (':'-separated folders)
//   4. `extra_paths` in order (ciuic-run: --plugin-path, then [run] plugin_paths)
// A folder met twice (same canonical path) is scanned once. An entry of 3./4. may also name one
// plugin file directly. Missing folders of 3./4. are reported with a warning (and in error
// messages), missing default folders silently skipped.
//
// Discovery runs nothing of the files: a file whose name does not follow the pattern, that is not
// a regular readable ELF file, or whose dynamic symbol table lacks the entry points is refused
// with a warning naming it; several files of one slot and name get a warning naming the one used
// ("shadows"). A file is loaded only when first asked for by slot and name (find, get, create,
// find_info — the plugins a recipe names) or when everything is listed (list(), refusals(),
// shadowed(): --list-plugins), so --print-recipe, --plan and a run load only what they use.
//
// Loading: each file is checked (regular, readable file with an ELF header), dlopen'ed with
// RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE (through Boost.DLL), and its info record (the
// `ciuic_plugin_info` entry point) is read before anything else of the plugin runs. The plugin
// is refused — with "<file>: <what was expected and what was found>" — when: the file is
// unreadable or not a shared library, it cannot be loaded (missing dependency, undefined
// symbol), an entry point is missing, its api_version differs from kPluginApiVersion, its build
// fingerprint differs from core_build_fingerprint(), its slot/name differ from its file name, or
// its option list is malformed (e.g. a default that is not of the option's type). A refused
// plugin's factory is never called; refusals are kept for --list-plugins and for the error when
// a recipe asks for that plugin.
//
// Duplicates: when two files provide the same (slot, name), the one found LATER in the search
// order wins (so --plugin-path overrides an installed plugin of the same name) when it loads, else
// the one before it, and so on; the accepted losers are listed by shadowed().
//
// Lifetime: libraries are never unloaded (RTLD_NODELETE): plugins register LibTorch operators,
// CUDA/NCCL state, thread-locals and atexit handlers that must not outlive their code, and even a
// refused plugin's static initialisers have run. On top of that, every object created through
// create() holds its library's handle (the shared_ptr deleter owns a reference), as in Boost.DLL's
// reference-counting tutorial, so the ownership is explicit even if NODELETE were dropped.
//
// Threading: discover() on one thread; afterwards its const methods may be called from any thread
// (loading on first use is serialised by a mutex), except create(), which runs plugin factories
// and must be called from the main thread (ciuic/plugin.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/export.h>
#include <ciuic/plugin.h>

#include "recipe/recipe.h"

namespace ciuic {

struct PluginDescriptor {
  Slot slot;
  std::string name, version, summary, path;
  const PluginInfo* info;  // the plugin's static record; valid until process exit
};

class CIUIC_API Registry final : public PluginCatalog {
 public:
  // The default search path (1.-3. above) followed by `extra_paths`; see the file comment.
  static Registry discover(const std::vector<std::string>& extra_paths);
  // Only `paths` (folders or plugin files): for tests and embedders.
  static Registry from_paths(const std::vector<std::string>& paths);

  // Accepted plugins, sorted by slot (enum order), then name. Loads every candidate file (for
  // --list-plugins); list(slot) loads those of one slot only.
  std::vector<PluginDescriptor> list() const;
  std::vector<PluginDescriptor> list(Slot slot) const;
  const PluginDescriptor* find(Slot slot, std::string_view name) const;
  // Throws UsageError(why_missing(slot, name)) when there is no such accepted plugin.
  const PluginDescriptor& get(Slot slot, std::string_view name) const;
  // "plugin <slot>/<name> (<file>)": the prefix of every error a plugin call raises.
  std::string describe(Slot slot, std::string_view name) const;
  // PluginCatalog: "unknown <slot> plugin '<name>'", the closest name, the available plugins of
  // that slot, the searched folders, and the refusal of any file of that name.
  const PluginInfo* find_info(Slot slot, std::string_view name) const override;
  std::string why_missing(Slot slot, std::string_view name) const override;
  // "<file>: <why>" for every refused file, in search order.
  std::vector<std::string> refusals() const;
  // "<file>: shadowed by <file>" for accepted files that lost to a later one of the same name.
  std::vector<std::string> shadowed() const;
  // The folders (and files) searched, in order; missing ones are suffixed " (missing)".
  std::vector<std::string> search_path() const;

  // Creates the object through the plugin's factory (get() errors if unknown or refused). The
  // object keeps its library alive and owns a copy of `config`; `ctx` must outlive it.
  // Exceptions from the factory are rethrown as ciuic::Error (same exit code for ciuic errors)
  // with "plugin <slot>/<name> (<path>): " in front; a factory returning null is an Error too.
  std::shared_ptr<PluginObject> create_object(Slot slot, std::string_view name,
                                              const Config& config, const RunContext& ctx) const;
  // create_object() cast to the slot's interface (Comm, Sharding, Optimizer, Precision,
  // DataSource); an object of another type is an Error naming the plugin and both types.
  template <class T>
  std::shared_ptr<T> create(Slot slot, std::string_view name, const Config& config,
                            const RunContext& ctx) const {
    std::shared_ptr<PluginObject> obj = create_object(slot, name, config, ctx);
    if (auto typed = std::dynamic_pointer_cast<T>(obj)) return typed;
    wrong_type(slot, name, typeid(T), *obj);
  }

  struct Impl;

 private:
  explicit Registry(std::shared_ptr<const Impl> impl);
  std::vector<PluginDescriptor> winners(std::optional<Slot> slot) const;  // caller holds the lock
  [[noreturn]] void wrong_type(Slot slot, std::string_view name, const std::type_info& want,
                               const PluginObject& got) const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ciuic
