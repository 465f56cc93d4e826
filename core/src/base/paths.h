// Internal: what is wrong with a path a user gave (CLI flag, recipe key, a file named by another
// file), in words, without throwing. The std::filesystem calls without an error_code throw
// std::filesystem_error for a name the file system refuses (ENAMETOOLONG, ELOOP, EACCES), which
// reached the user as "filesystem error: status: File name too long [...]" instead of an error
// naming the key or flag; callers ask here first and throw their own ciuic::Error / UsageError.
#pragma once

#include <string>

#include <ciuic/export.h>

namespace ciuic::paths {

enum class Want { kFile, kFolder, kAny };

// "" when `path` exists and is what `want` asks (a regular file, a folder, anything); else the
// reason: "no such file" / "no such folder" / "no such file or folder", "<ancestor> is a file, not
// a folder" (a path through a regular file), the system's text for a refused name ("File name too
// long", "Permission denied", ...), "a folder, not a file", "not a folder (a file)", "not a regular
// file (a FIFO)". Never throws (but std::bad_alloc).
CIUIC_API std::string problem(const std::string& path, Want want);

// Whether `path` exists as `want`; false also when it cannot be looked at (see problem()).
CIUIC_API bool is(const std::string& path, Want want);

// Why a folder cannot be created at `path`, or "" when it exists as a folder or all its missing
// parts can be made (as far as stat(2) tells: a file in the way, a refused name, an unreadable
// parent). Never throws.
CIUIC_API std::string folder_problem(const std::string& path);

// Creates the folder `path` and its parents; on failure throws UsageError "<what> <path> cannot
// be created: <reason>" (the path came from the user: the reason is theirs to fix), e.g.
// "[run] output_dir /a/f/x cannot be created: /a/f is a file, not a folder".
CIUIC_API void create_folders(const std::string& path, const std::string& what);

}  // namespace ciuic::paths
