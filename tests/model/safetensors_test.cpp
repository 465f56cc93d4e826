// safetensors: round trips for every dtype, sharding, reading files written by Python's
// safetensors package, and every error path with its message (crafted broken files).
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/deep_json.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous(), y = b.contiguous();
  // memcmp's pointers must not be null even for 0 bytes (UBSan): an empty tensor has none.
  return x.nbytes() == y.nbytes() &&
         (x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0);
}

// A file with the given header JSON text and `data_bytes` bytes of payload.
std::string craft(const std::string& dir, const std::string& name, const std::string& header,
                  size_t data_bytes, std::optional<uint64_t> header_len = std::nullopt) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header_len.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
  return path;
}

NamedTensors every_dtype() {
  NamedTensors t;
  at::manual_seed(3);
  t.emplace_back("f32", at::randn({3, 5}));
  t.emplace_back("f64", at::randn({4}, at::kDouble));
  t.emplace_back("f16", at::randn({2, 3, 2}).to(at::kHalf));
  t.emplace_back("bf16", at::randn({7}).to(at::kBFloat16));
  t.emplace_back("f8e4m3", at::randn({5}).to(at::kFloat8_e4m3fn));
  t.emplace_back("f8e5m2", at::randn({5}).to(at::kFloat8_e5m2));
  t.emplace_back("i64", at::randint(-1000000000000LL, 1000000000000LL, {3, 2}, at::kLong));
  t.emplace_back("i32", at::randint(-100000, 100000, {9}, at::kInt));
  t.emplace_back("i16", at::randint(-30000, 30000, {3}, at::kShort));
  t.emplace_back("i8", at::randint(-128, 127, {3}, at::kChar));
  t.emplace_back("u8",
                 at::randint(0, 255, {11}, at::kByte));  // odd size: later tensors are misaligned
  t.emplace_back("bool", at::randint(0, 2, {2, 3}, at::kLong).to(at::kBool));
  t.emplace_back("u16", at::randint(0, 60000, {3}, at::kInt).to(at::kUInt16));
  t.emplace_back("u32", at::randint(0, 1 << 30, {3}, at::kLong).to(at::kUInt32));
  t.emplace_back("scalar", at::randn({}));
  t.emplace_back("empty", at::zeros({0, 4}));
  t.emplace_back("f32_after_odd", at::randn({2, 2}));
  return t;
}

TEST(Safetensors, RoundTripIsExactForEveryDtype) {
  const std::string dir = testing::temp_dir("rt");
  const NamedTensors tensors = every_dtype();
  SafetensorsWriteOptions o;
  o.metadata = {{"format", "pt"}, {"note", "round trip"}};
  write_safetensors(dir + "/t.safetensors", tensors, o);
  auto f = SafetensorsFile::open(dir + "/t.safetensors");
  EXPECT_EQ(f->metadata(), o.metadata);
  ASSERT_EQ(f->entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = f->tensor(name);
    EXPECT_TRUE(same_bytes(back, t)) << name;
    EXPECT_EQ(f->entry(name).dtype, t.scalar_type()) << name;
  }
  // The header is padded so that the data starts 8-byte aligned (as the reference writer does).
  uint64_t hl = 0;
  std::ifstream(dir + "/t.safetensors", std::ios::binary).read(reinterpret_cast<char*>(&hl), 8);
  EXPECT_EQ(hl % 8, 0u);
  // No temporary files left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Safetensors, ViewsAreCopyOnWrite) {
  const std::string dir = testing::temp_dir("cow");
  write_safetensors(dir + "/t.safetensors", {{"x", at::arange(8, at::kFloat)}});
  {
    auto f = SafetensorsFile::open(dir + "/t.safetensors");
    at::Tensor v = f->tensor("x");
    v.fill_(42.0f);  // writes to the private mapping only
  }
  auto f = SafetensorsFile::open(dir + "/t.safetensors");
  EXPECT_TRUE(at::equal(f->tensor("x"), at::arange(8, at::kFloat)));
  // A view outlives the file object that made it.
  at::Tensor keep = SafetensorsFile::open(dir + "/t.safetensors")->tensor("x");
  EXPECT_EQ(keep[7].item<float>(), 7.0f);
}

TEST(Safetensors, FloatDtypeConversionOnWriteAndLoad) {
  const std::string dir = testing::temp_dir("conv");
  const at::Tensor w = at::randn({4, 3});
  const at::Tensor ids = at::arange(5, at::kLong);
  SafetensorsWriteOptions o;
  o.float_dtype = at::kBFloat16;
  write_safetensors(dir + "/t.safetensors", {{"w", w}, {"ids", ids}}, o);
  auto r = SafetensorsReader::open(dir + "/t.safetensors");
  EXPECT_EQ(r.entry("w").dtype, at::kBFloat16);
  EXPECT_EQ(r.entry("ids").dtype, at::kLong);  // integers keep their dtype
  at::Tensor dst = at::empty({4, 3}, at::kFloat);
  r.load_into("w", dst);
  EXPECT_TRUE(at::equal(dst, w.to(at::kBFloat16).to(at::kFloat)));
}

TEST(Safetensors, ReadsFilesWrittenByPythonSafetensors) {
  // expected.safetensors and the fixture weights were written by Python's safetensors package.
  const auto& r = testing::expected();
  const at::Tensor ids = r.tensor("tiny.input_ids");
  const at::Tensor labels = r.tensor("tiny.labels");
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_EQ(ids.sizes(), (c10::IntArrayRef{2, 12}));
  // labels are input_ids shifted left, -100 elsewhere (as the generator wrote them)
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t + 1 < 12; ++t) {
      const int64_t l = labels[b][t].item<int64_t>();
      if (l != -100) EXPECT_EQ(l, ids[b][t + 1].item<int64_t>());
    }
  auto w = SafetensorsReader::open(testing::fixture("tiny"));
  EXPECT_EQ(w.entry("model.embed_tokens.weight").dtype, at::kBFloat16);
  EXPECT_EQ(w.entry("model.embed_tokens.weight").shape, (std::vector<int64_t>{300, 64}));
  EXPECT_FALSE(w.contains("lm_head.weight"));  // tied: transformers saves the embedding only
}

TEST(Safetensors, ShardedWriteAndRead) {
  const std::string dir = testing::temp_dir("sharded");
  NamedTensors tensors;
  for (int i = 0; i < 5; ++i)
    tensors.emplace_back("layer." + std::to_string(i), at::randn({10, 10}));  // 400 B
  const auto files = write_safetensors_sharded(dir, tensors, 900);  // two tensors per shard
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(files[3], "model.safetensors.index.json");
  std::ifstream in(dir + "/model.safetensors.index.json");
  const json index = json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["layer.4"], "model-00003-of-00003.safetensors");
  for (const std::string& path : {dir, dir + "/model.safetensors.index.json"}) {
    auto r = SafetensorsReader::open(path);
    EXPECT_EQ(r.names().size(), 5u);
    for (const auto& [name, t] : tensors) EXPECT_TRUE(same_bytes(r.tensor(name), t)) << name;
    EXPECT_EQ(fs::path(r.file_of("layer.2")).filename(), "model-00002-of-00003.safetensors");
  }
  // One shard: a plain model.safetensors without index.
  const std::string dir1 = testing::temp_dir("single");
  EXPECT_EQ(write_safetensors_sharded(dir1, tensors, 1 << 20),
            (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(SafetensorsReader::open(dir1).names().size(), 5u);
  // A tensor larger than the limit gets a shard of its own.
  const std::string dir2 = testing::temp_dir("big");
  EXPECT_EQ(write_safetensors_sharded(dir2, tensors, 100).size(), 6u);
}

TEST(Safetensors, FileErrorsNameFileAndTensor) {
  const std::string dir = testing::temp_dir("err");
  {
    const std::string p = dir + "/short.safetensors";
    std::ofstream(p) << "abc";
    expect_error([&] { SafetensorsFile::open(p); }, {p, "truncated", "8-byte header length"});
  }
  {
    // A huge header length is refused before any allocation.
    const std::string p = craft(dir, "huge.safetensors", "{}", 0, uint64_t{1} << 40);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "header too large", "1099511627776"});
  }
  {
    const std::string p = craft(dir, "hdr.safetensors", "{}", 0, 500);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "truncated", "the header needs 500 bytes"});
  }
  {
    const std::string p = craft(dir, "json.safetensors", "{\"a\": {\"dtype\": ", 0);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "malformed safetensors header JSON"});
  }
  {
    const std::string p =
        craft(dir, "dtype.safetensors",
              R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `w`", "unsupported dtype \"F7\""});
  }
  {
    const std::string p =
        craft(dir, "size.safetensors",
              R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `w`", "span 8 bytes", "need 12"});
  }
  {
    const std::string p =
        craft(dir, "inv.safetensors",
              R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `w`", "inverted"});
  }
  {
    const std::string p =
        craft(dir, "shape.safetensors",
              R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `w`", "malformed shape"});
  }
  {
    const std::string p =
        craft(dir, "entry.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `w`", "data_offsets"});
  }
  {
    // Nested 100,000 deep: refused before a value is built (issue 27; ciuic/json.h). The depth
    // of the 129th open bracket: `{"w": ` then 128 of `[`.
    const std::string p = craft(dir, "deep.safetensors",
                                "{\"w\": " + ciuic_test::nested_arrays(ciuic_test::kDeep) + "}", 0);
    expect_error([&] { SafetensorsFile::open(p); },
                 {p + ": safetensors header: JSON nested deeper than 128 levels (arrays and "
                      "objects) at line 1, column 134"});
  }
  {
    const std::string p = craft(dir, "meta.safetensors", R"({"__metadata__": {"a": 1}})", 0);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "__metadata__.a must be a string"});
  }
  {
    // A real file cut short: the last tensor's data runs past the end.
    const std::string p = dir + "/cut.safetensors";
    write_safetensors(p, {{"a", at::randn({4})}, {"b", at::randn({100})}});
    fs::resize_file(p, fs::file_size(p) - 10);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `b`", "truncated file"});
  }
  expect_error([&] { SafetensorsFile::open(dir + "/none.safetensors"); },
               {dir + "/none.safetensors", "cannot open"});
  {
    const std::string p = dir + "/ok.safetensors";
    write_safetensors(p, {{"w", at::randn({2, 3})}, {"ids", at::arange(3, at::kLong)}});
    auto r = SafetensorsReader::open(p);
    expect_error([&] { r.tensor("nope"); }, {p, "missing tensor `nope`"});
    at::Tensor wrong_shape = at::empty({3, 2});
    expect_error([&] { r.load_into("w", wrong_shape); },
                 {p, "tensor `w`", "shape [2, 3] in the file, [3, 2] expected"});
    at::Tensor wrong_dtype = at::empty({3});
    expect_error([&] { r.load_into("ids", wrong_dtype); },
                 {p, "tensor `ids`", "dtype I64 in the file"});
    expect_error([&] { SafetensorsFile::open(p)->entry("zz"); }, {p, "tensor `zz` not found"});
  }
}

// The layout rules of the reference loader: tensors cover the data exactly (no overlap, hole or
// trailing bytes), no key given twice, the header length exact. Each file is hand-built.
TEST(Safetensors, LayoutMustCoverDataExactly) {
  const std::string dir = testing::temp_dir("layout");
  const std::string two = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                          R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  {
    // The well-formed file loads (a control for the cases below).
    const std::string p = craft(dir, "good.safetensors", two, 16);
    EXPECT_EQ(SafetensorsFile::open(p)->entries().size(), 2u);
  }
  {
    const std::string p = craft(dir, "overlap.safetensors",
                                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                                R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                12);
    expect_error([&] { SafetensorsFile::open(p); },
                 {p, "tensor `b`", "[4, 12]", "overlap", "tensor `a`"});
  }
  {
    // Both names on the same bytes.
    const std::string p = craft(dir, "same.safetensors",
                                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                                R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                                8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "overlap"});
  }
  {
    const std::string p = craft(dir, "hole.safetensors",
                                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                                R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
                                20);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `b`", "hole", "[8, 12)"});
  }
  {
    const std::string p =
        craft(dir, "first.safetensors",
              R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `a`", "hole", "start at 0"});
  }
  {
    const std::string p = craft(dir, "trail.safetensors", two, 17);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "1 byte(s) after the end", "tensor `b`"});
  }
  {
    const std::string p = craft(dir, "empty_trail.safetensors", "{}", 3);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "3 byte(s)", "no tensor"});
  }
  {
    // Header length one short: the closing brace is read as data (a trailing byte, and malformed
    // JSON); one long: the first data byte is read as header (malformed JSON or shifted data).
    const std::string h =
        two + " ";  // a trailing space, as writers pad, keeps the JSON valid at len-1
    const std::string p = craft(dir, "short_len.safetensors", h, 16, h.size() - 1);
    expect_error([&] { SafetensorsFile::open(p); },
                 {p, "1 byte(s) after the end", "header length"});
    const std::string q = dir + "/long_len.safetensors";
    {
      std::ofstream out(q, std::ios::binary);
      const uint64_t n =
          two.size() + 1;  // swallows the first data byte (a space, so the JSON parses)
      out.write(reinterpret_cast<const char*>(&n), 8);
      out << two << ' ' << std::string(15, '\0');
    }
    expect_error([&] { SafetensorsFile::open(q); }, {q, "tensor `b`", "truncated file"});
  }
  {
    const std::string p = craft(dir, "dup_tensor.safetensors",
                                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                                R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                                16);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "key \"a\" appears twice"});
  }
  {
    const std::string p = craft(
        dir, "dup_field.safetensors",
        R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [2], "data_offsets": [0, 8]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "key \"dtype\" appears twice"});
  }
  {
    // __metadata__ may repeat its keys (the last wins), as in the reference loader.
    const std::string p = craft(dir, "dup_meta.safetensors",
                                R"({"__metadata__": {"f": "1", "f": "2"}, )"
                                R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                                8);
    EXPECT_EQ(SafetensorsFile::open(p)->metadata().at("f"), "2");
  }
  {
    // dtype x shape must match the byte span (F16 of 3 elements is 6 bytes, not 8).
    const std::string p =
        craft(dir, "span.safetensors",
              R"({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}})", 8);
    expect_error([&] { SafetensorsFile::open(p); }, {p, "tensor `a`", "span 8 bytes", "need 6"});
  }
}

TEST(Safetensors, RefusesNonRegularFiles) {
  const std::string dir = testing::temp_dir("special");
  // A named pipe: opening must not wait for a writer (the test has a ctest TIMEOUT as well).
  const std::string fifo = dir + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { SafetensorsFile::open(fifo); }, {fifo, "not a regular file"});
  expect_error([&] { SafetensorsFile::open("/dev/zero"); },
               {"/dev/zero", "not a regular file (a device)"});
  expect_error([&] { SafetensorsFile::open(fifo); }, {"not a regular file (a FIFO (named pipe))"});
  // A folder named model.safetensors is a directory (it was called "a device, pipe or socket").
  const std::string folder = dir + "/model.safetensors";
  std::filesystem::create_directories(folder);
  expect_error([&] { SafetensorsFile::open(folder); },
               {folder + ": not a regular file (a directory): expected a safetensors file"});
}

TEST(Safetensors, WriteErrors) {
  const std::string dir = testing::temp_dir("werr");
  expect_error(
      [&] {
        write_safetensors(dir + "/d.safetensors", {{"a", at::randn({1})}, {"a", at::randn({1})}});
      },
      {"d.safetensors", "tensor `a` given twice"});
  expect_error(
      [&] {
        write_safetensors(dir + "/c.safetensors", {{"z", at::randn({2}).to(at::kComplexFloat)}});
      },
      {"cannot store", "ComplexFloat"});
  expect_error(
      [&] {
        write_safetensors(dir + "/missing/x.safetensors", {{"a", at::randn({1})}});
      },
      {dir + "/missing/x.safetensors", "cannot create"});
  // Nothing half-written was left in place.
  EXPECT_FALSE(fs::exists(dir + "/d.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/c.safetensors"));
}

TEST(Safetensors, IndexAndFolderErrors) {
  const std::string dir = testing::temp_dir("idx");
  write_safetensors(dir + "/a.safetensors", {{"x", at::randn({2})}});
  {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
    expect_error([&] { SafetensorsReader::open(dir); },
                 {"model.safetensors.index.json", "tensor `y`", "b.safetensors", "does not exist"});
  }
  {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"x": "a.safetensors", "z": "a.safetensors"}})";
    expect_error([&] { SafetensorsReader::open(dir); },
                 {"tensor `z`", "a.safetensors", "does not contain it"});
  }
  {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"x": "../a.safetensors"}})";
    expect_error([&] { SafetensorsReader::open(dir); }, {"tensor `x`", "not a plain file name"});
  }
  {
    std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": )";
    expect_error([&] { SafetensorsReader::open(dir); },
                 {"model.safetensors.index.json", "malformed safetensors index JSON"});
  }
  {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"x": "a.safetensors"}, "metadata": )"
        << ciuic_test::nested_arrays(ciuic_test::kDeep) << "}";
    expect_error([&] { SafetensorsReader::open(dir); },
                 {"model.safetensors.index.json: JSON nested deeper than 128 levels"});
  }
  {
    std::ofstream(dir + "/model.safetensors.index.json") << R"({"weights": {}})";
    expect_error([&] { SafetensorsReader::open(dir); },
                 {"model.safetensors.index.json", "weight_map"});
  }
  const std::string empty = testing::temp_dir("empty");
  std::ofstream(empty + "/pytorch_model.bin") << "x";
  expect_error([&] { SafetensorsReader::open(empty); },
               {empty, "no *.safetensors", "pytorch_model.bin"});
  expect_error([&] { SafetensorsReader::open(empty + "/nothing"); },
               {empty + "/nothing", "no such file"});
  const std::string two = testing::temp_dir("two");
  write_safetensors(two + "/a.safetensors", {{"x", at::randn({2})}});
  write_safetensors(two + "/b.safetensors", {{"y", at::randn({2})}});
  expect_error([&] { SafetensorsReader::open(two); }, {two, "ambiguous"});
}

}  // namespace
}  // namespace ciuic::model
