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
#pragma once

#include <string>
#include <system_error>

#include <ciuic/export.h>

namespace ciuic {

CIUIC_API bool remove_tree(const std::string& path, std::error_code& ec);

}  // namespace ciuic
