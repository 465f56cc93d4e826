// Which failed worker the launcher names, and which of its lines it quotes (launch.h:
// is_error_line, is_secondary_error, FailureNotes).
#include <algorithm>
#include <cctype>
#include <string>

#include "launch/launch.h"

namespace ciuic::launch {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string_view trim_left(std::string_view s) {
  const size_t i = s.find_first_not_of(" \t");
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}

// "ciuic[3] info: ..." -> "info:"; "" when the line is not a ciuic log line. Also matches
// "ciuic-run: error: ..." (main's last word) -> "error:".
std::string_view ciuic_level(std::string_view line) {
  if (!starts_with(line, "ciuic")) return {};
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp > 16) return {};
  return line.substr(sp + 1);
}

// Lines that say nothing about why a worker failed: ciuic's log lines below error level,
// LibTorch's glog-style info/warning lines ("[W1201 04:42:24.08 socket.cpp:469] ..."), the
// lines of a c10 backtrace, progress redraws.
bool is_chatter(std::string_view line) {
  const std::string_view level = ciuic_level(line);
  for (std::string_view l : {"info:", "debug:", "warning:"})
    if (starts_with(level, l)) return true;
  if (line.size() > 2 && line[0] == '[' && (line[1] == 'I' || line[1] == 'W') &&
      std::isdigit(static_cast<unsigned char>(line[2])))
    return true;
  const std::string_view t = trim_left(line);
  return t.empty() || starts_with(t, "frame #") || starts_with(t, "Exception raised from") ||
         line.find('\033') != std::string_view::npos;
}

}  // namespace

bool is_error_line(std::string_view line) {
  if (starts_with(ciuic_level(line), "error:")) return true;
  if (starts_with(line, "terminate called")) return true;
  return starts_with(trim_left(line), "what():");
}

bool is_secondary_error(std::string_view line) {
  std::string lower(line);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* p :
       {"connection reset by peer", "connection closed by peer", "broken pipe",
        "connection refused", "remote process exited", "timed out", "timeout waiting",
        "could not reach the run's store", "lost contact with the run's store"})
    if (lower.find(p) != std::string::npos) return true;
  return false;
}

FailureNotes::Rank& FailureNotes::of(int rank) {
  for (auto& [r, notes] : ranks_)
    if (r == rank) return notes;
  ranks_.emplace_back(rank, Rank{});
  return ranks_.back().second;
}

void FailureNotes::line(int rank, std::string_view line, bool from_stderr) {
  Rank& r = of(rank);
  if (is_error_line(line)) {
    if (r.first_error.empty()) {
      r.first_error = std::string(line);
      r.first_error_at = ++seq_;
      r.awaiting_what = starts_with(line, "terminate called");
    } else if (r.awaiting_what && starts_with(trim_left(line), "what():")) {
      r.first_error += ": " + std::string(trim_left(line));
      r.awaiting_what = false;
    }
    return;
  }
  if (from_stderr && !is_chatter(line)) r.last_plain = std::string(line);
}

void FailureNotes::failed(int rank) {
  Rank& r = of(rank);
  if (!r.failed_at) r.failed_at = ++seq_;
}

std::optional<FailureNotes::Pick> FailureNotes::pick() const {
  std::optional<Pick> best;
  uint64_t best_at = 0;
  for (const auto& [rank, r] : ranks_) {
    if (!r.failed_at) continue;
    Pick p;
    p.rank = rank;
    p.error_line = !r.first_error.empty();
    p.quote = p.error_line ? r.first_error : r.last_plain;
    p.secondary = !p.quote.empty() && is_secondary_error(p.quote);
    const uint64_t at = p.error_line ? std::min(r.first_error_at, r.failed_at) : r.failed_at;
    if (!best || (p.secondary != best->secondary ? !p.secondary : at < best_at)) {
      best = std::move(p);
      best_at = at;
    }
  }
  return best;
}

}  // namespace ciuic::launch
