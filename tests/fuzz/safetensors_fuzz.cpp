// tests/fuzz/safetensors_fuzz.cpp — the safetensors reader: header, entries, tensor views, and
// the sharded-set index (model/safetensors.h).
//
// Input: the bytes of a .safetensors file; they are also tried as a sharded set's index JSON.
// The bytes go to a temporary file of exactly their size (the reader memory-maps it, so ASan
// and the bounds checks see the true end of the "file").
// Checks: only ciuic::Error escapes (with a short, valid UTF-8 message); an accepted file's
// tensors lie inside the file, in order, without overlap, each with bytes = elements x dtype
// size, and every tensor view reads back (first and last byte).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "model/safetensors.h"

namespace {

std::string temp_folder() {
  static const std::string d = [] {
    char tmpl[] = "/tmp/ciuic-fuzz-safetensors-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (!p) ciuic::fuzz::fail("mkdtemp", "/tmp");
    return std::string(p);
  }();
  return d;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ciuic;
  const std::string dir = temp_folder();
  const std::string file = dir + "/model.safetensors";
  write(file, data, size);
  fuzz::expect_ok_or_error([&] {
    const auto f = model::SafetensorsFile::open(file);
    std::vector<const model::SafetensorsEntry*> by_offset;
    for (const auto& e : f->entries()) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(),
              [](auto* a, auto* b) { return a->offset < b->offset; });
    uint64_t prev_end = 8;  // the header length field
    for (const auto* e : by_offset) {
      fuzz::check(e->offset >= prev_end, "tensors overlap or lie in the header", e->name);
      fuzz::check(e->offset + e->nbytes <= size, "a tensor runs past the end of the file", e->name);
      prev_end = e->offset + e->nbytes;
    }
    uint64_t end = 0;
    for (const auto& e : f->entries()) {
      const at::Tensor t = f->tensor(e.name);
      const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
      fuzz::check(bytes == e.nbytes, "bytes differ from elements x dtype size", e.name);
      fuzz::check(bytes <= size, "a tensor larger than the file", e.name);
      if (bytes > 0) {
        const auto* p = static_cast<const volatile uint8_t*>(t.data_ptr());
        (void)p[0];
        (void)p[bytes - 1];
      }
      end += bytes;
    }
    fuzz::check(end <= size, "the tensors hold more bytes than the file");
  });
  // The same bytes as a sharded set's index next to the file above (its shards: that file).
  ::unlink(file.c_str());
  const std::string index = dir + "/model.safetensors.index.json";
  write(index, data, size);
  fuzz::expect_ok_or_error([&] { model::SafetensorsReader::open(index); });
  ::unlink(index.c_str());
  return 0;
}
