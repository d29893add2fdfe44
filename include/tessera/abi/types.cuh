// Fixed-width integer names shared by host and device code (the ABI's
// structs and every device header).
#pragma once

namespace tessera {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

}  // namespace tessera
