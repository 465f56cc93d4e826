// ciuic/checksum.h — CRC-32C (Castagnoli) for checksumming files and buffers.
//
// Uses the SSE4.2 crc32 instruction when the CPU has it (chosen at run time; about 8 GB/s per
// core), a table-driven fallback otherwise; both give the same values (the iSCSI/ext4 CRC-32C,
// check value crc32c("123456789") == 0xE3069283). Thread-safe, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ciuic/export.h>

namespace ciuic {

// Extends `crc` (0 to start) with `n` bytes at `data`.
CIUIC_API uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// CRC-32C of a whole file, read in large blocks. Throws ciuic::Error naming the file on I/O
// errors.
CIUIC_API uint32_t crc32c_file(const std::string& path);

}  // namespace ciuic
