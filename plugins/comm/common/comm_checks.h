// Argument checks, metrics and message helpers shared by the in-tree comm plugins (gloo, nccl).
// Header only, SDK types only: each plugin compiles its own copy (plugins never link each other).
// Every check throws ciuic::Error("comm <backend>: <op>: ...") naming the argument and what was
// expected.
#pragma once

#include <ATen/core/Tensor.h>
#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/metrics.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace ciuic::comm_common {

inline std::string seconds_str(std::chrono::milliseconds t) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

inline int64_t nbytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

// Checks shared by every collective; `backend` is "gloo", "nccl", ...
class ArgChecker {
 public:
  ArgChecker(const char* backend, int size) : backend_(backend), size_(size) {}

  [[noreturn]] void fail(const char* op, const std::string& what) const {
    throw Error(std::string("comm ") + backend_ + ": " + op + ": " + what);
  }
  void defined_contiguous(const at::Tensor& t, const char* op, const char* which) const {
    if (!t.defined()) fail(op, std::string(which) + " is undefined");
    if (!t.is_contiguous()) fail(op, std::string(which) + " is not contiguous");
  }
  void same_dtype(const at::Tensor& out, const at::Tensor& in, const char* op) const {
    if (out.scalar_type() != in.scalar_type())
      fail(op, std::string("output is ") + c10::toString(out.scalar_type()) + " but input is " +
                   c10::toString(in.scalar_type()));
  }
  // reduce_scatter: input.numel() == size * output.numel().
  void scatter_sizes(const at::Tensor& out, const at::Tensor& in) const {
    if (in.numel() != out.numel() * size_)
      fail("reduce_scatter", "input has " + std::to_string(in.numel()) +
                                 " elements, expected size() * output.numel() = " +
                                 std::to_string(out.numel() * size_));
  }
  // all_gather: output.numel() == size * input.numel().
  void gather_sizes(const at::Tensor& out, const at::Tensor& in) const {
    if (out.numel() != in.numel() * size_)
      fail("all_gather", "output has " + std::to_string(out.numel()) +
                             " elements, expected size() * input.numel() = " +
                             std::to_string(in.numel() * size_));
  }
  void root(int root) const {
    if (root < 0 || root >= size_)
      fail("broadcast",
           "root " + std::to_string(root) + " is not a rank of 0.." + std::to_string(size_ - 1));
  }

 private:
  const char* backend_;
  int size_;
};

}  // namespace ciuic::comm_common
