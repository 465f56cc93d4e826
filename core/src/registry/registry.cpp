// Plugin discovery and loading; see registry.h for the rules.
#include "registry/registry.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <boost/core/demangle.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <c10/util/Exception.h>

#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/version.h>

#include "base/text.h"
#include "recipe/schema.h"

namespace ciuic {

namespace fs = std::filesystem;

struct Registry::Impl {
  struct Entry {
    PluginDescriptor desc;
    std::shared_ptr<boost::dll::shared_library> lib;
    PluginFactoryFn* factory = nullptr;
  };
  struct Refused {
    std::string path;
    std::string slot, name;  // from the file name; empty when it does not follow the pattern
    std::string why;
    size_t order = 0;  // position in the search order (refusals() lists in that order)
  };
  // A file named libciuic_<slot>_<name>.so that passed the checks that run no code of it; it is
  // loaded (dlopen: its constructors run) only when the run asks for its slot and name, or when
  // everything is listed.
  struct Candidate {
    std::string path;
    Slot slot{};
    std::string name;
    size_t order = 0;
    bool tried = false;            // loaded or refused
    const Entry* entry = nullptr;  // accepted
  };
  std::vector<std::string> search;
  mutable std::mutex mu;  // guards everything below (loading happens on first use)
  mutable std::vector<Candidate> candidates;  // in search order
  mutable std::deque<Entry> entries;          // accepted files (stable addresses)
  mutable std::vector<Refused> refused;

  // The accepted file for (slot, name): the candidates of that name tried from the last one in
  // the search order back, until one is accepted. Caller holds mu.
  const Entry* winner(Slot slot, std::string_view name) const;
  void load_all() const;
  void load(Candidate& c) const;
};

namespace {

constexpr std::string_view kPrefix = "libciuic_";
constexpr std::string_view kSuffix = ".so";

bool looks_like_plugin(const std::string& file) {
  return file.size() > kPrefix.size() + kSuffix.size() && file.rfind(kPrefix, 0) == 0 &&
         file.compare(file.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

// Splits "libciuic_<slot>_<name>.so"; false when <slot> is not a slot name or <name> is empty.
bool parse_file_name(const std::string& file, Slot& slot, std::string& name) {
  std::string rest = file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
  for (int i = 0; i < kNumSlots; ++i) {
    std::string s = std::string(slot_name(static_cast<Slot>(i))) + "_";
    if (rest.rfind(s, 0) == 0 && rest.size() > s.size()) {
      slot = static_cast<Slot>(i);
      name = rest.substr(s.size());
      return true;
    }
  }
  return false;
}

std::string slot_list() {
  std::vector<std::string> v;
  for (int i = 0; i < kNumSlots; ++i) v.emplace_back(slot_name(static_cast<Slot>(i)));
  return text::join(v, ", ");
}

// Checks the declared options; "" when fine.
std::string check_options(const PluginInfo& info) {
  if (info.num_options > 0 && !info.options)
    return "declares " + std::to_string(info.num_options) + " options but no option array";
  std::set<std::string> seen;
  for (uint32_t i = 0; i < info.num_options; ++i) {
    const OptionSpec& o = info.options[i];
    if (!o.key || !*o.key) return "option #" + std::to_string(i) + " has no key";
    const std::string key = o.key;
    if (key == "plugin") return "option 'plugin' is reserved (it names the plugin in the recipe)";
    if (!seen.insert(key).second) return "option '" + key + "' is declared twice";
    if (static_cast<uint32_t>(o.type) > static_cast<uint32_t>(OptionType::kFloatList))
      return "option '" + key + "' has unknown type " +
             std::to_string(static_cast<uint32_t>(o.type));
    if (o.choices && o.type != OptionType::kString)
      return "option '" + key + "' has choices but is not a string option";
    if (o.flags & ~kOptionPlanned)
      return "option '" + key + "' has unknown flags " + std::to_string(o.flags) +
             " (this ciuic knows kOptionPlanned)";
    if ((o.flags & kOptionPlanned) && o.type == OptionType::kInt) {
      if (!std::isfinite(o.min) || !std::isfinite(o.max) || o.min >= o.max)
        return "option '" + key +
               "' is a kOptionPlanned integer without a finite range min < max (the planner "
               "searches it)";
    } else if ((o.flags & kOptionPlanned) &&
               (o.type != OptionType::kString || !o.choices ||
                std::string_view(o.choices).rfind("auto|", 0) != 0 ||
                std::count(o.choices, o.choices + std::strlen(o.choices), '|') < 2)) {
      return "option '" + key +
             "' is kOptionPlanned but its choices are not \"auto|<first>|<second>|...\" (found " +
             (o.choices ? "\"" + std::string(o.choices) + "\"" : std::string("none")) + ")";
    }
    std::string problem = recipe::check_default(recipe::key_from_option(o));
    if (!problem.empty()) return "option '" + key + "': " + problem;
  }
  return "";
}

// Why `path` cannot be a plugin before dlopen, or "".
std::string precheck_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::string("cannot be read: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "cannot be read: not a regular file";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot be read: ") + std::strerror(errno);
  unsigned char magic[4] = {0, 0, 0, 0};
  ssize_t n = ::read(fd, magic, sizeof magic);
  ::close(fd);
  if (n != 4 || magic[0] != 0x7f || magic[1] != 'E' || magic[2] != 'L' || magic[3] != 'F')
    return "not a shared library (expected an ELF file, found " +
           (n <= 0 ? std::string("an empty file") : std::string("other content")) + ")";
  return "";
}

const char* elf_symbol_type(unsigned type) {
  switch (type) {
    case STT_NOTYPE: return "untyped";
    case STT_OBJECT: return "a data object";
    case STT_FUNC: return "a function";
    case STT_SECTION: return "a section";
    case STT_FILE: return "a file";
    case STT_COMMON: return "a common block";
    case STT_TLS: return "a thread-local variable";
    case STT_GNU_IFUNC: return "an indirect function";
    default: return "of an unknown kind";
  }
}

// True when `addr` lies in an executable segment (PT_LOAD with PF_X) of the object `map`.
bool in_executable_segment(const link_map* map, const void* addr) {
  struct Query {
    const link_map* map;
    uintptr_t addr;
    bool found;
  } q{map, reinterpret_cast<uintptr_t>(addr), false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* q = static_cast<Query*>(data);
        if (info->dlpi_addr != q->map->l_addr || !info->dlpi_name || !q->map->l_name ||
            std::strcmp(info->dlpi_name, q->map->l_name) != 0)
          return 0;
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (q->addr >= start && q->addr < start + ph.p_memsz) q->found = true;
        }
        return 1;
      },
      &q);
  return q.found;
}

// The entry point `name` of the loaded library `handle`, read the way CIUIC_DEFINE_PLUGIN
// exports it: a Boost.DLL alias, i.e. an exported data object holding the entry point's address.
// Everything is checked before the address is used: the symbol is defined by this library (not a
// dependency), it is a data object of pointer size (a plain extern "C" function of that name
// would otherwise be read as a pointer and its machine code called: SIGSEGV), and the address it
// holds lies in this library's code. nullptr with `why` set otherwise.
void* read_entry_alias(void* handle, const char* name, std::string& why) {
  const std::string sym = std::string("entry symbol '") + name + "'";
  dlerror();
  void* addr = dlsym(handle, name);
  if (!addr) {
    why = "not a ciuic plugin: " + sym +
          " not found (expected a library defined with CIUIC_DEFINE_PLUGIN)";
    return nullptr;
  }
  link_map* self = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &self) != 0 || !self) {
    why = "cannot inspect the loaded library (dlinfo failed)";
    return nullptr;
  }
  Dl_info di{};
  link_map* owner = nullptr;
  if (!dladdr1(addr, &di, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) || owner != self) {
    why = "not a ciuic plugin: " + sym + " is not defined in this file but in " +
          (di.dli_fname && *di.dli_fname ? std::string(di.dli_fname)
                                         : std::string("another library")) +
          " (expected a library defined with CIUIC_DEFINE_PLUGIN)";
    return nullptr;
  }
  void* entry = nullptr;
  const int found = dladdr1(addr, &di, &entry, RTLD_DL_SYMENT);
  const auto* es = static_cast<const ElfW(Sym)*>(entry);
  if (!found || !es || !di.dli_sname || std::strcmp(di.dli_sname, name) != 0 ||
      di.dli_saddr != addr) {
    why = "not a ciuic plugin: " + sym + " cannot be found in the library's symbol table";
    return nullptr;
  }
  const unsigned type = ELF64_ST_TYPE(es->st_info);
  if (type != STT_OBJECT || es->st_size != sizeof(void*)) {
    why = "not a ciuic plugin: " + sym + " is " + elf_symbol_type(type) + " of " +
          std::to_string(es->st_size) + " bytes, expected a Boost.DLL alias (a data object of " +
          std::to_string(sizeof(void*)) +
          " bytes holding the entry point's address); define the plugin with CIUIC_DEFINE_PLUGIN "
          "instead of exporting extern \"C\" functions of that name";
    return nullptr;
  }
  void* target = *static_cast<void* const*>(addr);
  if (!in_executable_segment(self, target)) {
    why = "not a ciuic plugin: " + sym +
          " does not hold the address of code in this library (expected a Boost.DLL alias of a "
          "function, as CIUIC_DEFINE_PLUGIN defines)";
    return nullptr;
  }
  return target;
}

// Defined dynamic symbols among `names` of the 64-bit ELF file at `path`, read from its section
// headers (nothing of the file runs); nullopt when the file cannot be read that way (then only
// loading it tells).
std::optional<std::set<std::string>> defined_symbols(const std::string& path,
                                                     const std::vector<std::string>& names) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    ::close(fd);
    return std::nullopt;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return std::nullopt;
  const auto* base = static_cast<const unsigned char*>(map);
  std::optional<std::set<std::string>> out;
  auto in = [&](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (eh->e_ident[EI_CLASS] == ELFCLASS64 && eh->e_shentsize == sizeof(Elf64_Shdr) &&
      in(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr)) && eh->e_shnum > 0) {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_DYNSYM) continue;
      if (sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(Elf64_Sym)) break;
      const Elf64_Shdr& strs = sh[sh[i].sh_link];
      if (!in(sh[i].sh_offset, sh[i].sh_size) || !in(strs.sh_offset, strs.sh_size)) break;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
      const char* str = reinterpret_cast<const char*>(base + strs.sh_offset);
      out.emplace();
      for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
        if (syms[k].st_shndx == SHN_UNDEF || syms[k].st_name >= strs.sh_size) continue;
        const char* n = str + syms[k].st_name;
        const size_t len = strnlen(n, strs.sh_size - syms[k].st_name);
        for (const auto& want : names)
          if (want.size() == len && want.compare(0, len, n, len) == 0) out->insert(want);
      }
      break;
    }
  }
  ::munmap(map, size);
  return out;
}

// Scans the search path: finds the candidate files and refuses, with a warning, those that are
// not plugins by their name or content — without loading any.
class Scanner {
 public:
  explicit Scanner(Registry::Impl& r) : r_(r) {}

  void add_path(const std::string& entry, bool is_default) {
    std::error_code ec;
    fs::path p(entry);
    if (!fs::exists(p, ec) && !fs::is_symlink(p, ec)) {
      if (!is_default) {
        r_.search.push_back(entry + " (missing)");
        log_warn("plugin path " + entry + " does not exist");
      }
      return;
    }
    fs::path canon = fs::weakly_canonical(p, ec);
    if (!seen_dirs_.insert(canon.string()).second) return;
    r_.search.push_back(entry);
    if (!fs::is_directory(p, ec)) {
      add_file(p.string());
      return;
    }
    std::vector<std::string> files;
    for (const auto& de :
         fs::directory_iterator(p, fs::directory_options::skip_permission_denied, ec)) {
      const std::string f = de.path().filename().string();
      if (looks_like_plugin(f)) files.push_back(de.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) add_file(f);
  }

  // Warns of every (slot, name) that several files provide: the last one in the search order is
  // the one used (when it loads).
  void finish() {
    std::map<std::pair<int, std::string>, std::vector<const Registry::Impl::Candidate*>> by_name;
    for (const auto& c : r_.candidates) by_name[{static_cast<int>(c.slot), c.name}].push_back(&c);
    for (const auto& [key, files] : by_name) {
      if (files.size() < 2) continue;
      std::vector<std::string> others;
      for (size_t i = 0; i + 1 < files.size(); ++i) others.push_back(files[i]->path);
      log_warn("plugin " + std::string(slot_name(static_cast<Slot>(key.first))) + "/" + key.second +
               ": " + files.back()->path + " shadows " + text::join(others, ", ") +
               " (the last one found in the plugin search path is used)");
    }
  }

 private:
  void refuse(const std::string& path, const std::string& slot, const std::string& name,
              std::string why) {
    log_warn("plugin path: " + path + " is not loaded: " + why);
    r_.refused.push_back({path, slot, name, std::move(why), order_++});
  }

  void add_file(const std::string& path) {
    std::error_code ec;
    fs::path canon = fs::weakly_canonical(path, ec);
    if (!seen_files_.insert(canon.string()).second) return;
    const std::string file = fs::path(path).filename().string();
    Slot fslot{};
    std::string fname;
    if (!looks_like_plugin(file) || !parse_file_name(file, fslot, fname)) {
      if (file.rfind("libciuic_offload_", 0) == 0)
        refuse(path, "", "",
               "the 'offload' slot is now 'optimizer' (plugin API " +
                   std::to_string(kPluginApiVersion) +
                   "): port the plugin to ciuic::Optimizer (ciuic/optimizer.h) and rebuild it as "
                   "libciuic_optimizer_<name>.so");
      else
        refuse(path, "", "",
               "file name does not follow libciuic_<slot>_<name>.so with <slot> one of " +
                   slot_list());
      return;
    }
    const std::string fs_slot = slot_name(fslot);
    if (std::string why = precheck_file(path); !why.empty()) {
      refuse(path, fs_slot, fname, why);
      return;
    }
    if (auto syms = defined_symbols(path, {kPluginInfoSymbol, kPluginFactorySymbol})) {
      for (const char* sym : {kPluginInfoSymbol, kPluginFactorySymbol})
        if (!syms->count(sym)) {
          refuse(path, fs_slot, fname,
                 std::string("not a ciuic plugin: entry symbol '") + sym +
                     "' not found (expected a library defined with CIUIC_DEFINE_PLUGIN)");
          return;
        }
    }
    Registry::Impl::Candidate c;
    c.path = path;
    c.slot = fslot;
    c.name = fname;
    c.order = order_++;
    r_.candidates.push_back(std::move(c));
  }

  Registry::Impl& r_;
  std::set<std::string> seen_dirs_, seen_files_;
  size_t order_ = 0;
};

}  // namespace

void Registry::Impl::load(Candidate& c) const {
  c.tried = true;
  const std::string& path = c.path;
  const std::string fs_slot = slot_name(c.slot);
  const std::string& fname = c.name;
  auto refuse = [&](std::string why) {
    log_debug("plugin " + path + " refused: " + why);
    refused.push_back({path, fs_slot, fname, std::move(why), c.order});
  };
  auto lib = std::make_shared<boost::dll::shared_library>();
  boost::dll::fs::error_code lec;
  lib->load(boost::dll::fs::path(path),
            static_cast<boost::dll::load_mode::type>(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE), lec);
  if (lec || !lib->is_loaded()) {
    const char* dl = dlerror();
    return refuse(std::string("cannot be loaded as a shared library: ") +
                  (dl ? dl : lec.message()));
  }
  // Both entry points are checked before either is called.
  std::string why;
  void* info_fn = read_entry_alias(lib->native(), kPluginInfoSymbol, why);
  void* create_fn = info_fn ? read_entry_alias(lib->native(), kPluginFactorySymbol, why) : nullptr;
  if (!info_fn || !create_fn) return refuse(why);
  const PluginInfo* info = nullptr;
  try {
    info = reinterpret_cast<PluginInfoFn*>(info_fn)();
  } catch (const std::exception& e) {
    return refuse(std::string("its info entry point threw: ") + e.what());
  }
  if (!info) return refuse("its info entry point returned null");
  // Only api_version is read before it is known to match: the rest of the record's layout
  // belongs to that API version.
  if (info->api_version != kPluginApiVersion)
    return refuse("plugin API version mismatch: expected " + std::to_string(kPluginApiVersion) +
                  " (ciuic " CIUIC_VERSION "), found " + std::to_string(info->api_version) +
                  "; rebuild the plugin against this ciuic SDK");
  const std::string fp = info->build_fingerprint ? info->build_fingerprint : "(none)";
  if (fp != core_build_fingerprint())
    return refuse(
        std::string("build fingerprint mismatch: expected \"") + core_build_fingerprint() +
        "\", found \"" + fp +
        "\"; rebuild the plugin with the same LibTorch version, C++ ABI and compiler as ciuic");
  if (static_cast<uint32_t>(info->slot) >= static_cast<uint32_t>(kNumSlots) || !info->name ||
      !info->version || !info->summary)
    return refuse("malformed info record (unknown slot or missing name/version/summary)");
  const std::string islot = slot_name(info->slot);
  if (info->slot != c.slot || fname != info->name)
    return refuse("declares slot '" + islot + "' and name '" + info->name +
                  "' but its file name says slot '" + fs_slot + "' and name '" + fname +
                  "' (expected file name libciuic_" + islot + "_" + info->name + ".so)");
  if (std::string problem = check_options(*info); !problem.empty())
    return refuse("bad option declaration: " + problem);
  Entry e;
  e.desc = PluginDescriptor{info->slot, info->name, info->version, info->summary, path, info};
  e.lib = lib;
  e.factory = reinterpret_cast<PluginFactoryFn*>(create_fn);
  log_debug("plugin " + islot + "/" + e.desc.name + " " + e.desc.version + " loaded from " + path);
  entries.push_back(std::move(e));
  c.entry = &entries.back();
}

const Registry::Impl::Entry* Registry::Impl::winner(Slot slot, std::string_view name) const {
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (it->slot != slot || it->name != name) continue;
    if (!it->tried) load(*it);
    if (it->entry) return it->entry;
  }
  return nullptr;
}

void Registry::Impl::load_all() const {
  for (auto& c : candidates)
    if (!c.tried) load(c);
}

namespace {

std::vector<std::string> default_paths() {
  std::vector<std::string> out;
  std::error_code ec;
  boost::dll::fs::error_code bec;
  fs::path exe = boost::dll::program_location(bec);
  if (!bec)
    out.push_back(
        (exe.parent_path() / ".." / "lib" / "ciuic" / "plugins").lexically_normal().string());
  fs::path core = boost::dll::this_line_location(bec);
  if (!bec) out.push_back((core.parent_path() / "ciuic" / "plugins").lexically_normal().string());
  return out;
}

}  // namespace

namespace {
std::vector<Registry::Impl::Refused> sorted_refusals(const Registry::Impl& impl) {
  auto out = impl.refused;
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  return out;
}
}  // namespace

Registry::Registry(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Registry Registry::discover(const std::vector<std::string>& extra_paths) {
  auto impl = std::make_shared<Impl>();
  Scanner scan(*impl);
  for (const auto& p : default_paths()) scan.add_path(p, true);
  if (const char* env = std::getenv("CIUIC_PLUGIN_PATH")) {
    for (const auto& p : text::split(env, ':'))
      if (!p.empty()) scan.add_path(p, false);
  }
  for (const auto& p : extra_paths) scan.add_path(p, false);
  scan.finish();
  return Registry(std::move(impl));
}

Registry Registry::from_paths(const std::vector<std::string>& paths) {
  auto impl = std::make_shared<Impl>();
  Scanner scan(*impl);
  for (const auto& p : paths) scan.add_path(p, false);
  scan.finish();
  return Registry(std::move(impl));
}

std::vector<PluginDescriptor> Registry::list() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->load_all();
  return winners(std::nullopt);
}

std::vector<PluginDescriptor> Registry::list(Slot slot) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return winners(slot);
}

std::vector<PluginDescriptor> Registry::winners(std::optional<Slot> slot) const {
  std::set<std::pair<int, std::string>> names;
  for (const auto& c : impl_->candidates)
    if (!slot || c.slot == *slot) names.insert({static_cast<int>(c.slot), c.name});
  std::vector<PluginDescriptor> out;  // sorted by (slot, name), as the set is
  for (const auto& [sl, name] : names)
    if (const Impl::Entry* e = impl_->winner(static_cast<Slot>(sl), name)) out.push_back(e->desc);
  return out;
}

const PluginDescriptor* Registry::find(Slot slot, std::string_view name) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  const Impl::Entry* e = impl_->winner(slot, name);
  return e ? &e->desc : nullptr;
}

std::string Registry::why_missing(Slot slot, std::string_view name) const {
  const std::string s = slot_name(slot);
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->winner(slot, name);  // tries every file of that name
  // The other names of the slot, from the file names (loading them would run their code).
  std::set<std::string> unique;
  for (const auto& c : impl_->candidates)
    if (c.slot == slot && (!c.tried || c.entry)) unique.insert(c.name);
  std::vector<std::string> names(unique.begin(), unique.end());
  std::string msg = "unknown " + s + " plugin '" + std::string(name) + "'";
  for (const auto& r : sorted_refusals(*impl_))
    if (r.slot == s && r.name == name) msg += "; " + r.path + " was refused: " + r.why;
  std::string near = text::closest(name, names);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  if (names.empty())
    msg += "; no " + s + " plugins were found";
  else
    msg += "; available " + s + " plugins: " + text::join(names, ", ");
  msg += " (searched: " +
         (impl_->search.empty() ? std::string("nothing") : text::join(impl_->search, ", ")) +
         "; add folders with --plugin-path, $CIUIC_PLUGIN_PATH or [run] plugin_paths)";
  return msg;
}

const PluginInfo* Registry::find_info(Slot slot, std::string_view name) const {
  const PluginDescriptor* d = find(slot, name);
  return d ? d->info : nullptr;
}

const PluginDescriptor& Registry::get(Slot slot, std::string_view name) const {
  if (const PluginDescriptor* d = find(slot, name)) return *d;
  throw UsageError(why_missing(slot, name));
}

std::vector<std::string> Registry::refusals() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->load_all();
  std::vector<std::string> out;
  for (const auto& r : sorted_refusals(*impl_)) out.push_back(r.path + ": " + r.why);
  return out;
}

std::vector<std::string> Registry::shadowed() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->load_all();
  std::vector<std::string> out;
  std::map<std::pair<int, std::string>, std::vector<std::string>> accepted;  // in search order
  for (const auto& c : impl_->candidates)
    if (c.entry) accepted[{static_cast<int>(c.slot), c.name}].push_back(c.path);
  for (const auto& c : impl_->candidates) {
    const auto& files = accepted[{static_cast<int>(c.slot), c.name}];
    if (c.entry && files.back() != c.path) out.push_back(c.path + ": shadowed by " + files.back());
  }
  return out;
}

std::vector<std::string> Registry::search_path() const { return impl_->search; }

std::shared_ptr<PluginObject> Registry::create_object(Slot slot, std::string_view name,
                                                      const Config& config,
                                                      const RunContext& ctx) const {
  const PluginDescriptor& d = get(slot, name);
  const Impl::Entry* e = nullptr;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    e = impl_->winner(slot, name);
  }
  const std::string context = describe(slot, d.name);
  auto cfg = std::make_shared<const Config>(config);
  PluginObject* raw = nullptr;
  try {
    raw = e->factory(PluginArgs{*cfg, ctx});
  } catch (const Error& err) {
    throw err.with_context(context);
  } catch (const c10::Error& err) {
    throw Error(context + ": " + err.what_without_backtrace());
  } catch (const std::exception& err) {
    throw Error(context + ": " + err.what());
  } catch (...) {
    throw Error(context + ": unknown exception");
  }
  if (!raw) throw Error(context + ": the factory returned no object");
  auto lib = e->lib;
  return std::shared_ptr<PluginObject>(raw, [lib, cfg](PluginObject* p) { delete p; });
}

std::string Registry::describe(Slot slot, std::string_view name) const {
  const PluginDescriptor& d = get(slot, name);
  return "plugin " + std::string(slot_name(slot)) + "/" + d.name + " (" + d.path + ")";
}

void Registry::wrong_type(Slot slot, std::string_view name, const std::type_info& want,
                          const PluginObject& got) const {
  const PluginDescriptor& d = get(slot, name);
  throw Error("plugin " + std::string(slot_name(slot)) + "/" + d.name + " (" + d.path +
              ") created a " + boost::core::demangle(typeid(got).name()) + ", which is not a " +
              boost::core::demangle(want.name()));
}

}  // namespace ciuic
