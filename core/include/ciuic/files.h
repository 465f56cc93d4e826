// ciuic/files.h — file-system helpers for the core and plugins.
//
// remove_tree() deletes a file or a folder with everything below it, like
// std::filesystem::remove_all(path, ec), written with POSIX nftw(). Do not call that overload of
// std::filesystem::remove_all in code that may run next to the CUDA build of LibTorch: the pip
// wheel's libtorch.so exports its own copy of that symbol, the dynamic linker binds our call to
// it, and it crashes (seen on the GPU host: a SIGSEGV at address 0 inside remove_all, from the
// data cache and from the Hugging Face export).
//
// Threading: any thread. Failure: returns false and sets `ec` (the first error met); what could
// be removed before it is gone. A path that does not exist is not an error.
//
// read_input() reads a text input a user names (recipe, tokenizer.json, config.json, ...): only a
// regular file is read (a FIFO, device, socket or folder is refused at once: the open is
// non-blocking, so a FIFO without a writer does not wait, and the type is checked with fstat(2)
// before any read), and only up to `max_bytes` (a larger file is refused before it is read).
// Failure: ciuic::Error (exit code 1) "cannot read <what> <path>: <reason>", <reason> being the
// system's error text, "not a regular file (a FIFO (named pipe))" or "it has N bytes, over the
// limit of M bytes for this file". Callers that report recipe problems turn it into a UsageError.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

#include <ciuic/export.h>

namespace ciuic {

CIUIC_API bool remove_tree(const std::string& path, std::error_code& ec);

// Size bounds for text inputs (documented in docs/reliability.md).
inline constexpr uint64_t kMaxRecipeBytes = 16ull << 20;  // a recipe or an included file
inline constexpr uint64_t kMaxJsonInputBytes = 256ull
                                               << 20;  // tokenizer.json, config.json, manifests

// The whole content of the regular file `path` (see the file comment); `what` names its role in
// messages ("recipe", "tokenizer file").
CIUIC_API std::string read_input(const std::string& path, const std::string& what,
                                 uint64_t max_bytes);

}  // namespace ciuic
