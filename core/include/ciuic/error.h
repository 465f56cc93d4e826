// ciuic/error.h — the two error types and the process exit codes.
//
// Every failure that reaches the user is a ciuic::Error carrying the exit code the process ends
// with. Messages are complete sentences that name the thing at fault (file:line:col, key, plugin,
// rank, step) and what was expected; callers add context by catching and rethrowing with
// Error::with_context, never by swallowing.
//
// Exit codes (documented in `ciuic-run --help` and the README):
//   0   success
//   1   runtime failure (training diverged, I/O error, worker crash, out of memory, ...)
//   2   usage error: bad command line, recipe, plugin (refused, missing, bad option)
//   130 interrupted by SIGINT/SIGTERM (a checkpoint was written when the recipe asks for it)
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <ciuic/export.h>

namespace ciuic {

enum ExitCode : int {
  kExitOk = 0,
  kExitRuntime = 1,
  kExitUsage = 2,
  kExitInterrupted = 130,
};

// A failure the user must see. Thread-safe to construct and copy; what() is the full message, safe
// to print: bytes that are not well-formed UTF-8 and control bytes but \n, \t are written \xNN (a
// NUL does not cut it, a quoted config sends no ESC), C1/bidi controls \uXXXX (sdk/printable.h); a
// line longer than 1000 bytes keeps its first 700 and last 200 bytes around " ... (N bytes cut) ...
// ".
class CIUIC_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int exit_code = kExitRuntime);
  int exit_code() const noexcept { return exit_code_; }
  // A copy whose message is "<context>: <message>", same exit code.
  Error with_context(std::string_view context) const;

 private:
  int exit_code_;
};

// Errors in what the user wrote or asked for: command line, recipe, plugin choice/options.
// Exit code 2.
class CIUIC_API UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message, kExitUsage) {}
};

}  // namespace ciuic
