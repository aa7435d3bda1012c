// CRC-32 (the polynomial of zip, gzip and PNG), as zlib's crc32_z computes it, by carry-less
// multiplication (PCLMULQDQ) where the processor has it: a file's checksum at memory speed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace adjoint {

// The CRC-32 of `size` bytes continuing from `crc` (0 to start): crc32_z(crc, bytes, size).
uint32_t crc32_update(uint32_t crc, const unsigned char* bytes, size_t size);

}  // namespace adjoint
