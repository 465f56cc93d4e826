// Internal: TensorBoard event files written by hand (no TensorFlow, no protobuf library).
//
// An event file is a TFRecord stream: each record is
//   uint64 length (little endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked
//   CRC-32C of data,  masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8,
// and each data is a serialized tensorflow.Event protobuf. The first event carries
// file_version "brain.Event:2"; every scalar is an Event{wall_time, step, summary{value{tag,
// simple_value}}}, the form TensorBoard's scalar dashboard (and torch's SummaryWriter) uses.
// tests/report/monitoring_test.cpp checks the bytes against a file written by the tensorboard
// package's own EventFileWriter and protos, and reads ours back with its event reader.
//
// Records are flushed after every add_scalars() call, so a crashed run keeps what it logged.
// Not thread-safe; rank 0 owns one.
#pragma once

#include <ciuic/export.h>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ciuic::report {

class CIUIC_API TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens a new events.out.tfevents.<unix time>.<host>.<pid>.ciuic
  // in it. Throws ciuic::Error when it cannot. `wall_time` < 0 means now (tests pass fixed times).
  explicit TensorBoardWriter(const std::string& dir, double wall_time = -1);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event per value, all at `step`; non-finite values are written as they are.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                   double wall_time = -1);
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time = -1) {
    add_scalars(step, {{tag, value}}, wall_time);
  }
  const std::string& path() const { return path_; }

  // The record framing and protobuf encodings, exposed for tests.
  static std::string frame(const std::string& data);
  static std::string file_version_event(double wall_time);
  static std::string scalar_event(double wall_time, int64_t step, const std::string& tag,
                                  float value);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace ciuic::report
