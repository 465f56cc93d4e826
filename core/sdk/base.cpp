// Small pieces of the SDK with no better home: errors, logging, slot names, the fingerprint,
// out-of-line virtual destructors and default methods of the interfaces.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unistd.h>

#include <ciuic/comm.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/optimizer.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/store.h>
#include <ciuic/tokenizer.h>

#include "printable.h"

namespace ciuic {

namespace {

// A line of more than kMaxLine bytes keeps its first and last bytes around a note of the cut:
// messages quote excerpts, never whole inputs (a 50 MB JSONL line, a --set of a megabyte).
std::string bounded_lines(const std::string& s) {
  constexpr size_t kMaxLine = 1000, kHead = 700, kTail = 200;
  auto boundary = [&](size_t i) {  // back to the start of a UTF-8 character
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  std::string out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    if (nl - start <= kMaxLine) {
      out.append(s, start, nl - start);
    } else {
      const size_t head_end = boundary(start + kHead), tail_begin = boundary(nl - kTail);
      out.append(s, start, head_end - start);
      out += " ... (" + std::to_string(tail_begin - head_end) + " bytes cut) ... ";
      out.append(s, tail_begin, nl - tail_begin);
    }
    if (nl < s.size()) out += '\n';
    start = nl + 1;
  }
  return out;
}

}  // namespace

// Messages quote what the user gave (file contents, names, keys): printable_text() writes every
// control byte and every byte that is not well-formed UTF-8 visibly (\x1b, \x00, \xff), so a
// terminal, a log line or a JSON field can hold the message as it is, a NUL cannot end it early
// and a quoted config cannot send escape sequences (issues 16 and 27).
Error::Error(const std::string& message, int exit_code)
    : std::runtime_error(bounded_lines(printable_text(message))), exit_code_(exit_code) {}

Error Error::with_context(std::string_view context) const {
  return Error(std::string(context) + ": " + what(), exit_code_);
}

// ---- logging ------------------------------------------------------------------------------
namespace {
std::mutex g_log_mu;
LogLevel g_level = LogLevel::kInfo;
int g_rank = -1;
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kError: return "error";
    default: return "";
  }
}
}  // namespace

void log(LogLevel level, std::string_view message) {
  if (level < g_level || level == LogLevel::kOff) return;
  std::string line;
  line.reserve(message.size() + 32);
  line += "ciuic";
  if (g_rank >= 0) line += "[" + std::to_string(g_rank) + "]";
  line += " ";
  line += level_name(level);
  line += ": ";
  line += printable_text(message);  // quoted input shows its control bytes, never sends them
  line += '\n';
  std::lock_guard<std::mutex> lock(g_log_mu);
  fwrite(line.data(), 1, line.size(), stderr);
  fflush(stderr);
}
void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_log_rank(int rank) { g_rank = rank; }

// ---- plugin ABI ---------------------------------------------------------------------------
const char* slot_name(Slot slot) {
  switch (slot) {
    case Slot::kComm: return "comm";
    case Slot::kSharding: return "sharding";
    case Slot::kOptimizer: return "optimizer";
    case Slot::kPrecision: return "precision";
    case Slot::kData: return "data";
  }
  return "unknown";
}
const char* core_build_fingerprint() { return CIUIC_BUILD_FINGERPRINT; }

PluginObject::~PluginObject() = default;
void PluginObject::append_metrics(Metrics&) const {}
Work::~Work() = default;
// The defaults of the slot interfaces (fp32 precision; nothing counted; no layer boundaries).
at::ScalarType Precision::param_dtype() const { return at::kFloat; }
at::ScalarType Precision::reduce_dtype() const { return at::kFloat; }
double Precision::loss_scale() const { return 1.0; }
bool Precision::needs_overflow_check() const { return false; }
bool Precision::update(bool, int64_t) { return false; }
void Precision::save_state(StateDict&) const {}
void Precision::load_state(const StateDict&) {}
void Precision::round_to_param(const at::Tensor& master, at::Tensor& out, int64_t,
                               const std::vector<PositionSpan>&) const {
  out.copy_(master);  // ATen's float -> bf16/fp16 conversion rounds to nearest even
}
bool Precision::rounds_to_nearest() const { return true; }
bool Precision::accepts_sharded_parameters() const { return false; }
void Sharding::before_group(int, GroupPass) {}
void Sharding::after_group(int, GroupPass) {}
ShardingMemory Sharding::memory() const { return {}; }
bool Sharding::builds_parameters() const { return false; }
bool Sharding::shards_parameters() const { return false; }
bool Optimizer::offer_early_update(const OptimizerStep&) { return false; }
OptimizerMemory Optimizer::memory() const { return {}; }
bool Optimizer::accepts_sharded_parameters() const { return false; }
CommCounters Comm::counters() const { return {}; }
int64_t DataSource::epoch() const { return -1; }
Store::~Store() = default;
Tokenizer::~Tokenizer() = default;
ChatTemplate::~ChatTemplate() = default;

// ---- in-memory store ----------------------------------------------------------------------
namespace {
class LocalStore final : public Store {
 public:
  explicit LocalStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      kv_[key] = value;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& key) override {
    wait({key});
    std::lock_guard<std::mutex> l(mu_);
    return kv_.at(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = kv_.find(key);
      v = (it == kv_.end() ? 0 : std::stoll(it->second)) + delta;
      kv_[key] = std::to_string(v);
    }
    cv_.notify_all();
    return v;
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> l(mu_);
    return kv_.count(key) > 0;
  }
  void wait(const std::vector<std::string>& keys) override {
    std::unique_lock<std::mutex> l(mu_);
    auto all = [&] {
      for (const auto& k : keys)
        if (!kv_.count(k)) return false;
      return true;
    };
    if (!cv_.wait_for(l, timeout_, all)) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw Error("store: timed out after " + std::to_string(timeout_.count()) +
                  " ms waiting for key(s) " + names);
    }
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};
}  // namespace

std::shared_ptr<Store> make_local_store(std::chrono::milliseconds timeout) {
  return std::make_shared<LocalStore>(timeout);
}

}  // namespace ciuic
