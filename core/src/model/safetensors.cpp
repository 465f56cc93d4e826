// safetensors: memory-mapped reading with full header validation, atomic (sharded) writing.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/irange.h>
#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

#include "base/paths.h"

namespace ciuic::model {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct DtypeCode {
  const char* code;
  at::ScalarType type;
};
const DtypeCode kDtypes[] = {
    {"BOOL", at::kBool},
    {"U8", at::kByte},
    {"I8", at::kChar},
    {"I16", at::kShort},
    {"I32", at::kInt},
    {"I64", at::kLong},
    {"U16", at::kUInt16},
    {"U32", at::kUInt32},
    {"U64", at::kUInt64},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"F32", at::kFloat},
    {"F64", at::kDouble},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
};

std::string shape_str(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string errno_str() { return std::strerror(errno); }

// Writes all of `data` to fd; throws naming `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": write failed: " + errno_str());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// A file written under a temporary name and renamed into place by commit(); removed otherwise.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    fs::path p(path);
    tmp_ = (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid())))
               .string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot create " + tmp_ + ": " + errno_str());
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  void write(const void* data, size_t n) { write_all(fd_, data, n, tmp_); }
  void commit() {
    if (::fsync(fd_) != 0) throw Error(tmp_ + ": fsync failed: " + errno_str());
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw Error(tmp_ + ": close failed: " + errno_str());
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw Error(path_ + ": cannot rename " + tmp_ + " into place: " + errno_str());
    committed_ = true;
    fsync_dir(fs::path(path_).parent_path());
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open: " + errno_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A parser callback that refuses a key repeated within one JSON object (nlohmann would keep the
// last one silently; the reference loader refuses a repeated field, and a repeated tensor name
// hides a tensor). Only "__metadata__" may repeat its own keys (the last wins, as in the
// reference).
json::parser_callback_t unique_keys_callback(const std::string& path) {
  struct State {
    std::vector<std::set<std::string>> open;  // keys of the objects being parsed, outermost first
    std::vector<bool> check;
    std::string last_top_key;
  };
  auto st = std::make_shared<State>();
  return [st, path](int, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::object_start) {
      st->check.push_back(!(st->open.size() == 1 && st->last_top_key == "__metadata__"));
      st->open.emplace_back();
    } else if (event == E::object_end) {
      if (!st->open.empty()) {
        st->open.pop_back();
        st->check.pop_back();
      }
    } else if (event == E::key && !st->open.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (st->open.size() == 1) st->last_top_key = k;
      if (st->check.back() && !st->open.back().insert(k).second) {
        const std::string shown = k.size() <= 80 ? k : k.substr(0, 77) + "...";
        throw Error(path + ": malformed safetensors header: key \"" + shown +
                    "\" appears twice in one object (a tensor or a field given twice)");
      }
    }
    return true;
  };
}

std::string range_str(uint64_t offset, uint64_t nbytes, uint64_t data_start) {
  return "[" + std::to_string(offset - data_start) + ", " +
         std::to_string(offset - data_start + nbytes) + "]";
}

// As the reference loader requires: sorted by offset, the tensors cover the data bytes (the file
// after the header) exactly: the first begins at 0, each where the previous ends (no overlap, no
// hole), the last at the end of the file (no trailing bytes). A header length off by one, a
// padded file or two tensors sharing bytes are refused here, not found later as wrong weights.
// Alignment is not required (nor is it by the reference): tensor() copies misaligned data.
void check_coverage(const std::vector<SafetensorsEntry>& sorted, uint64_t data_start,
                    uint64_t data_size, const std::string& path) {
  uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : sorted) {
    const uint64_t b = e.offset - data_start;
    const std::string where = path + ": tensor `" + e.name + "`: data_offsets " +
                              range_str(e.offset, e.nbytes, data_start);
    if (b < pos)
      throw Error(where + " overlap those of tensor `" + prev->name + "` " +
                  range_str(prev->offset, prev->nbytes, data_start) +
                  ": two tensors share bytes (a corrupt or hand-edited header)");
    if (b > pos)
      throw Error(where + " leave a hole: data bytes [" + std::to_string(pos) + ", " +
                  std::to_string(b) + ") belong to no tensor" +
                  (prev ? " (the previous tensor, `" + prev->name + "`, ends at " +
                              std::to_string(pos) + ")"
                        : std::string(" (the first tensor must start at 0)")) +
                  "; the format requires the tensors to cover the data exactly");
    pos = b + e.nbytes;
    prev = &e;
  }
  if (pos != data_size)
    throw Error(path + ": " + std::to_string(data_size - pos) +
                " byte(s) after the end of the last tensor's data (" +
                (prev ? "tensor `" + prev->name + "` ends at data byte " + std::to_string(pos)
                      : std::string("the header lists no tensor")) +
                ", the data has " + std::to_string(data_size) +
                " bytes): trailing garbage, or a wrong header length (" +
                std::to_string(data_start - 8) + ")");
}

uint64_t tensor_nbytes(const at::Tensor& t, at::ScalarType dtype) {
  return static_cast<uint64_t>(t.numel()) * c10::elementSize(dtype);
}

at::ScalarType written_dtype(const at::Tensor& t, const SafetensorsWriteOptions& o) {
  return (o.float_dtype && at::isFloatingType(t.scalar_type())) ? *o.float_dtype : t.scalar_type();
}

}  // namespace

std::optional<at::ScalarType> safetensors_dtype(std::string_view code) {
  for (const auto& d : kDtypes)
    if (code == d.code) return d.type;
  return std::nullopt;
}

std::string safetensors_dtype_code(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.code;
  throw Error(std::string("safetensors cannot store tensors of dtype ") + c10::toString(t));
}

// ---- SafetensorsFile ------------------------------------------------------------------------

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  // O_NONBLOCK: opening a named pipe must not wait for a writer; it is refused just below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open safetensors file: " + errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat: " + errno_str());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    throw Error(path + ": not a regular file (" + kind + "): expected a safetensors file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated safetensors file: " + std::to_string(f->size_) +
                " bytes, but the format starts with an 8-byte header length");
  }
  void* m = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error(path + ": mmap failed: " + errno_str());
  f->map_ = m;
  const auto* base = static_cast<const char*>(m);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxHeaderBytes)
    throw Error(path + ": safetensors header too large (" + std::to_string(header_len) +
                " bytes, limit " + std::to_string(kMaxHeaderBytes) +
                "): not a safetensors file, or corrupt");
  if (8 + header_len > f->size_)
    throw Error(path + ": truncated safetensors file: the header needs " +
                std::to_string(header_len) + " bytes after the length field, the file has " +
                std::to_string(f->size_ - 8));
  check_json_depth(std::string_view(base + 8, header_len), path + ": safetensors header");
  json h;
  try {
    h = json::parse(base + 8, base + 8 + header_len, unique_keys_callback(path));
  } catch (const json::exception& e) {  // parse_error, or out_of_range (a number that overflows)
    throw Error(path + ": malformed safetensors header JSON: " + e.what());
  }
  if (!h.is_object()) throw Error(path + ": malformed safetensors header: expected a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f->size_ - data_start;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object())
        throw Error(path + ": malformed safetensors header: __metadata__ must be an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string())
          throw Error(path + ": malformed safetensors header: __metadata__." + k +
                      " must be a string");
        f->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string& tensor_name = name;  // a structured binding cannot be captured (clang < 16)
    auto bad = [&](const std::string& what) -> Error {
      return Error(path + ": tensor `" + tensor_name + "`: " + what);
    };
    if (!e.is_object())
      throw bad("malformed header entry (expected an object with dtype, shape, data_offsets)");
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string())
      throw bad("malformed header entry: missing or non-string `dtype`");
    if (sh == e.end() || !sh->is_array())
      throw bad("malformed header entry: missing or non-array `shape`");
    if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw bad("malformed header entry: `data_offsets` must be two non-negative integers");
    SafetensorsEntry en;
    en.name = name;
    auto type = safetensors_dtype(dt->get<std::string>());
    if (!type) throw bad("unsupported dtype \"" + dt->get<std::string>() + "\"");
    en.dtype = *type;
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        throw bad("malformed shape " + sh->dump() + " (expected non-negative integers)");
      uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 48) || (v != 0 && numel > (1ull << 48) / v))
        throw bad("shape " + sh->dump() + " is too large");
      numel *= v;
      en.shape.push_back(static_cast<int64_t>(v));
    }
    const uint64_t b = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (b > end)
      throw bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(end) +
                "] are inverted");
    en.nbytes = end - b;
    if (en.nbytes != numel * c10::elementSize(en.dtype))
      throw bad("data_offsets span " + std::to_string(en.nbytes) + " bytes, but dtype " +
                dt->get<std::string>() + " and shape " + shape_str(en.shape) + " need " +
                std::to_string(numel * c10::elementSize(en.dtype)));
    if (end > data_size)
      throw bad("truncated file: the tensor's data ends at byte " +
                std::to_string(data_start + end) + " but the file has " + std::to_string(f->size_) +
                " bytes");
    en.offset = data_start + b;
    f->entries_.push_back(std::move(en));
  }
  std::sort(f->entries_.begin(), f->entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
            });
  check_coverage(f->entries_, data_start, data_size, path);
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  if (const auto* e = find(name)) return *e;
  throw Error(path_ + ": tensor `" + name + "` not found");
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  char* p = static_cast<char*>(map_) + e.offset;
  const auto opts = at::TensorOptions().dtype(e.dtype).device(at::kCPU);
  if (reinterpret_cast<uintptr_t>(p) % c10::elementSize(e.dtype) != 0) {
    at::Tensor t = at::empty(e.shape, opts);
    if (e.nbytes > 0) std::memcpy(t.data_ptr(), p, e.nbytes);  // an empty tensor has no data_ptr
    return t;
  }
  auto keep = shared_from_this();
  return at::from_blob(
      p, e.shape, [keep](void*) {}, opts);
}

// ---- SafetensorsReader ----------------------------------------------------------------------

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error(path + ": no such file or folder (expected safetensors weights)");
  std::string index_path, single_path;
  if (fs::is_directory(path, ec)) {
    fs::path dir(path);
    if (paths::is((dir / "model.safetensors.index.json").string(), paths::Want::kAny)) {
      index_path = (dir / "model.safetensors.index.json").string();
    } else if (paths::is((dir / "model.safetensors").string(), paths::Want::kAny)) {
      single_path = (dir / "model.safetensors").string();
    } else {
      std::vector<std::string> found, indexes;
      fs::directory_iterator it(dir, ec);
      if (ec) throw Error(path + ": cannot list the folder: " + ec.message());
      for (const auto& de : it) {
        const std::string n = de.path().filename().string();
        if (n.ends_with(".safetensors")) found.push_back(de.path().string());
        if (n.ends_with(".safetensors.index.json")) indexes.push_back(de.path().string());
      }
      if (indexes.size() == 1) {
        index_path = indexes[0];
      } else if (indexes.empty() && found.size() == 1) {
        single_path = found[0];
      } else if (found.empty() && indexes.empty()) {
        bool has_bin =
            paths::is((dir / "pytorch_model.bin").string(), paths::Want::kAny) ||
            paths::is((dir / "pytorch_model.bin.index.json").string(), paths::Want::kAny);
        throw Error(
            path + ": no *.safetensors weights in this folder" +
            std::string(has_bin
                            ? " (it holds pytorch_model.bin: convert it to safetensors, e.g. with "
                              "transformers' save_pretrained(safe_serialization=True))"
                            : ""));
      } else {
        throw Error(path +
                    ": ambiguous weights: several *.safetensors files (or indexes) and no "
                    "model.safetensors.index.json naming which to use");
      }
    }
  } else if (path.ends_with(".json")) {
    index_path = path;
  } else {
    single_path = path;
  }

  if (!single_path.empty()) {
    r.files_.push_back(SafetensorsFile::open(single_path));
    for (const auto& e : r.files_[0]->entries()) r.where_[e.name] = 0;
    return r;
  }
  const std::string index_text = read_text_file(index_path);
  check_json_depth(index_text, index_path);
  json idx;
  try {
    idx = json::parse(index_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range (a number that overflows)
    throw Error(index_path + ": malformed safetensors index JSON: " + e.what());
  }
  auto wm = idx.find("weight_map");
  if (!idx.is_object() || wm == idx.end() || !wm->is_object())
    throw Error(index_path +
                ": malformed safetensors index: expected an object with a \"weight_map\" object");
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, size_t> file_ids;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string())
      throw Error(index_path + ": weight_map entry for tensor `" + name +
                  "` must be a file name string");
    const std::string fname = file.get<std::string>();
    if (fname.find('/') != std::string::npos || fname == "..")
      throw Error(index_path + ": weight_map entry for tensor `" + name + "`: \"" + fname +
                  "\" is not a plain file name in the index's folder");
    auto it = file_ids.find(fname);
    if (it == file_ids.end()) {
      const std::string fpath = (dir / fname).string();
      std::error_code ec;  // a name the file system refuses (too long, ...) is an error, not a
                           // throw of std::filesystem
      if (!fs::exists(fpath, ec))
        throw Error(index_path + ": tensor `" + name + "` is in shard \"" + fname + "\", which " +
                    (ec ? "cannot be opened: " + ec.message() : std::string("does not exist")) +
                    " (" + fpath + ")");
      r.files_.push_back(SafetensorsFile::open(fpath));
      it = file_ids.emplace(fname, r.files_.size() - 1).first;
    }
    if (!r.files_[it->second]->find(name))
      throw Error(index_path + ": tensor `" + name + "` is listed in shard \"" + fname +
                  "\", but " + r.files_[it->second]->path() + " does not contain it");
    r.where_[name] = it->second;
  }
  return r;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, _] : where_) out.push_back(n);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const { return where_.count(name) != 0; }

const std::string& SafetensorsReader::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(path_ + ": missing tensor `" + name + "`");
  return files_[it->second]->path();
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(path_ + ": missing tensor `" + name + "`");
  return files_[it->second]->entry(name);
}

at::Tensor SafetensorsReader::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(path_ + ": missing tensor `" + name + "`");
  return files_[it->second]->tensor(name);
}

void SafetensorsReader::check_loadable(const std::string& name, const at::Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  const std::string& file = file_of(name);
  if (c10::IntArrayRef(e.shape) != dst.sizes())
    throw Error(file + ": tensor `" + name + "`: shape " + shape_str(e.shape) + " in the file, " +
                shape_str(dst.sizes()) + " expected");
  const bool convertible = at::isFloatingType(e.dtype) && at::isFloatingType(dst.scalar_type());
  if (e.dtype != dst.scalar_type() && !convertible)
    throw Error(file + ": tensor `" + name + "`: dtype " + safetensors_dtype_code(e.dtype) +
                " in the file, " + c10::toString(dst.scalar_type()) + " expected");
}

void SafetensorsReader::load_into(const std::string& name, const at::Tensor& dst) const {
  check_loadable(name, dst);
  at::NoGradGuard no_grad;
  dst.copy_(tensor(name));
}

void SafetensorsReader::load_slice_into(const std::string& name, int64_t offset,
                                        const at::Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  if (dst.dim() != 1 || offset < 0 || offset + dst.numel() > n)
    throw Error(file_of(name) + ": tensor `" + name + "`: elements [" + std::to_string(offset) +
                ", +" + std::to_string(dst.numel()) + ") asked of its " + std::to_string(n));
  if (e.dtype != dst.scalar_type() &&
      !(at::isFloatingType(e.dtype) && at::isFloatingType(dst.scalar_type())))
    throw Error(file_of(name) + ": tensor `" + name + "`: dtype " +
                safetensors_dtype_code(e.dtype) + " in the file, " +
                c10::toString(dst.scalar_type()) + " expected");
  at::NoGradGuard no_grad;
  dst.copy_(tensor(name).reshape({-1}).narrow(0, offset, dst.numel()));
}

// ---- writing --------------------------------------------------------------------------------

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const SafetensorsWriteOptions& options) {
  json header = json::object();
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw Error(path + ": invalid tensor name \"" + name + "\"");
    if (header.contains(name)) throw Error(path + ": tensor `" + name + "` given twice");
    if (!t.defined()) throw Error(path + ": tensor `" + name + "` is undefined");
    const at::ScalarType dt = written_dtype(t, options);
    const uint64_t n = tensor_nbytes(t, dt);
    header[name] = {{"dtype", safetensors_dtype_code(dt)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8,
           ' ');  // data starts 8-byte aligned, as the reference writer does
  const uint64_t hl = h.size();
  AtomicFile f(path);
  f.write(&hl, 8);
  f.write(h.data(), h.size());
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU, written_dtype(t, options)).contiguous();
    f.write(c.data_ptr(), c.nbytes());
  }
  f.commit();
}

std::vector<std::string> write_safetensors_sharded(const std::string& folder,
                                                   const NamedTensors& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const SafetensorsWriteOptions& options,
                                                   const std::string& prefix) {
  if (max_shard_bytes == 0) throw Error(folder + ": the shard size limit must be positive");
  std::vector<NamedTensors> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& nt : tensors) {
    const uint64_t n = tensor_nbytes(nt.second, written_dtype(nt.second, options));
    if (!shards.back().empty() && cur + n > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(nt);
    cur += n;
    total += n;
  }
  const fs::path dir(folder);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    const std::string name = prefix + ".safetensors";
    write_safetensors((dir / name).string(), shards[0], options);
    written.push_back(name);
    return written;
  }
  json weight_map = json::object();
  char buf[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    const std::string name = prefix + buf;
    write_safetensors((dir / name).string(), shards[i], options);
    for (const auto& nt : shards[i]) weight_map[nt.first] = name;
    written.push_back(name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string index_name = prefix + ".safetensors.index.json";
  write_file_atomic((dir / index_name).string(), index.dump(2) + "\n");
  written.push_back(index_name);
  return written;
}

}  // namespace ciuic::model
