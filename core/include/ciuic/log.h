// ciuic/log.h — process-wide logging for the core and plugins.
//
// Lines go to stderr as "ciuic[<rank>] <LEVEL> <message>" (rank omitted before it is known).
// Thread-safe: concurrent calls never interleave within a line. Messages are plain text; what they
// quote is shown, never sent: control bytes but \n, \t are written \xNN, as in ciuic::Error.
#pragma once

#include <string_view>

#include <ciuic/export.h>

namespace ciuic {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

CIUIC_API void log(LogLevel level, std::string_view message);
CIUIC_API void set_log_level(LogLevel level);
CIUIC_API LogLevel log_level();
// Rank shown in the prefix; -1 hides it. Set by the core when the worker starts.
CIUIC_API void set_log_rank(int rank);

inline void log_debug(std::string_view m) { log(LogLevel::kDebug, m); }
inline void log_info(std::string_view m) { log(LogLevel::kInfo, m); }
inline void log_warn(std::string_view m) { log(LogLevel::kWarn, m); }
inline void log_error(std::string_view m) { log(LogLevel::kError, m); }

}  // namespace ciuic
