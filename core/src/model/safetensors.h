// model/safetensors.h — reading and writing the safetensors format (Hugging Face weights).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [a, b], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// then the raw tensor bytes (row-major, little-endian); offsets count from the end of the header.
// Sharded sets add "<prefix>.safetensors.index.json": {"metadata": {...}, "weight_map": {name:
// file}}.
//
// Reading memory-maps each file (private copy-on-write mapping: a tensor view may be written to
// without ever changing the file). The header length is checked against kMaxHeaderBytes and the
// file size before anything is allocated or parsed; every entry's dtype, shape and byte range are
// validated at open(), so later reads cannot run outside the file.
//
// Writing is atomic per file (temp file in the same folder, fsync, rename); a sharded set writes
// its index last, so a reader never sees an index that names missing shards.
//
// Every error is a ciuic::Error whose message starts with the file and names the tensor at fault:
//   "<file>: tensor `model.norm.weight`: shape [64] in the file, [32] expected".
// Thread-safety: opened files and readers are immutable; concurrent reads are safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/export.h>

namespace ciuic::model {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Format dtype codes. Supported: BOOL U8 I8 I16 I32 I64 U16 U32 U64 F16 BF16 F32 F64 F8_E4M3
// F8_E5M2.
CIUIC_API std::optional<at::ScalarType> safetensors_dtype(std::string_view code);
// Throws ciuic::Error for a dtype the format cannot hold (complex, quantized).
CIUIC_API std::string safetensors_dtype_code(at::ScalarType t);

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // byte offset of the data from the start of the file
  uint64_t nbytes = 0;
};

// One memory-mapped .safetensors file. Created only through open(); the mapping lives as long as
// the object or any tensor returned by tensor() (they hold a reference to it).
class CIUIC_API SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // A header larger than this is refused before allocation (a corrupt or foreign file).
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // Maps and validates `path`. Errors: missing/unreadable file, shorter than 8 bytes, header too
  // large, header beyond the end of the file, malformed JSON, bad entries (unknown dtype, bad
  // shape, offsets inverted, byte count not matching dtype and shape), data past the end of the
  // file ("truncated").
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // Entries in data order (ascending offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // Throws "<file>: tensor `name` not found".
  const SafetensorsEntry& entry(const std::string& name) const;
  // A CPU tensor over the mapping (no copy), or a copy when the bytes are not aligned for the
  // dtype.
  at::Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a checkpoint: one file, or a sharded set described by an index.
class CIUIC_API SafetensorsReader {
 public:
  // `path` is one of: a .safetensors file; an *.index.json; a folder holding
  // model.safetensors.index.json, or model.safetensors, or exactly one *.safetensors file.
  // Errors name the folder or file: nothing to read, an index naming missing shards or tensors the
  // shard does not hold, malformed index JSON, plus every SafetensorsFile::open error.
  static SafetensorsReader open(const std::string& path);

  const std::string& path() const { return path_; }  // what open() was given
  std::vector<std::string> names() const;            // sorted
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming path and tensor
  const std::string& file_of(const std::string& name) const;     // throws likewise
  at::Tensor tensor(const std::string& name) const;              // CPU view, see SafetensorsFile
  // Copies tensor `name` into `dst` (any device). The shape must equal dst's; floating-point data
  // converts to dst's floating dtype, other dtypes must match exactly. Runs without autograd, so
  // `dst` may be a leaf parameter. Errors name the file and tensor and both shapes/dtypes.
  void load_into(const std::string& name, const at::Tensor& dst) const;
  // Elements [offset, offset + dst.numel()) of tensor `name`, flattened, into `dst` (1-D, any
  // device, converted as load_into does): only those bytes of the mapping are read. Errors name the
  // file and tensor (a range outside the tensor, a dtype load_into would refuse).
  void load_slice_into(const std::string& name, int64_t offset, const at::Tensor& dst) const;
  // The checks of load_into without copying (to validate a whole model before touching it).
  void check_loadable(const std::string& name, const at::Tensor& dst) const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> files_ index
};

struct SafetensorsWriteOptions {
  // Floating-point tensors are converted to this dtype as they are written (integer and bool
  // tensors keep theirs). nullopt: every tensor keeps its dtype.
  std::optional<at::ScalarType> float_dtype;
  std::map<std::string, std::string> metadata;  // written as "__metadata__"
};

// Writes `tensors` (any device, any layout) to one file, atomically. Errors: duplicate or empty
// names, unsupported dtypes, I/O failures (the target is then untouched).
CIUIC_API void write_safetensors(const std::string& path, const NamedTensors& tensors,
                                 const SafetensorsWriteOptions& options = {});

// Writes `tensors` into `folder` (which must exist) as shards of at most `max_shard_bytes` (a
// tensor larger than that gets a shard of its own), in the given order: "<prefix>.safetensors"
// when one shard suffices, else "<prefix>-00001-of-0000N.safetensors" ... plus
// "<prefix>.safetensors.index.json" (written last) with metadata.total_size and the weight_map.
// Returns the file names written (index last).
CIUIC_API std::vector<std::string> write_safetensors_sharded(
    const std::string& folder, const NamedTensors& tensors, uint64_t max_shard_bytes,
    const SafetensorsWriteOptions& options = {}, const std::string& prefix = "model");

// Writes `contents` to `path` atomically (temp file in the same folder, fsync, rename).
CIUIC_API void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace ciuic::model
