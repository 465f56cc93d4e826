#include "report/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include <ciuic/checksum.h>
#include <ciuic/error.h>

namespace ciuic::report {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint32_t masked_crc(const std::string& s) {
  const uint32_t c = crc32c(s.data(), s.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

// Protobuf fields: tag = (field << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5
// 32-bit).
void put_double(std::string& out, int field, double v) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 1);
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_le(out, bits, 8);
}

void put_float(std::string& out, int field, float v) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 5);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_le(out, bits, 4);
}

void put_int64(std::string& out, int field, int64_t v) {
  put_varint(out, static_cast<uint64_t>(field) << 3);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, int field, const std::string& v) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, v.size());
  out += v;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "host";
  std::string h(buf);
  for (char& c : h)
    if (c == '/' || c == ' ') c = '_';
  return h.empty() ? "host" : h;
}

}  // namespace

std::string TensorBoardWriter::frame(const std::string& data) {
  std::string len;
  put_le(len, data.size(), 8);
  std::string out = len;
  put_le(out, masked_crc(len), 4);
  out += data;
  put_le(out, masked_crc(data), 4);
  return out;
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary). Summary: value = 1 (repeated Value). Value: tag = 1, simple_value = 2.
std::string TensorBoardWriter::file_version_event(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string TensorBoardWriter::scalar_event(double wall_time, int64_t step, const std::string& tag,
                                            float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) put_int64(e, 2, step);  // proto3: a zero field is not written
  put_bytes(e, 5, summary);
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create the TensorBoard folder " + dir + ": " + ec.message());
  const double t = wall_time < 0 ? now_s() : wall_time;
  path_ = (fs::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." +
                            host_name() + "." + std::to_string(getpid()) + ".ciuic"))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw Error("cannot open " + path_ + " for writing");
  const std::string rec = frame(file_version_event(t));
  std::fwrite(rec.data(), 1, rec.size(), f_);
  std::fflush(f_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& values,
                                    double wall_time) {
  if (!f_) return;
  const double t = wall_time < 0 ? now_s() : wall_time;
  std::string out;
  for (const auto& [tag, v] : values)
    out += frame(scalar_event(t, step, tag, static_cast<float>(v)));
  if (std::fwrite(out.data(), 1, out.size(), f_) != out.size())
    throw Error("cannot write " + path_);
  std::fflush(f_);
}

}  // namespace ciuic::report
