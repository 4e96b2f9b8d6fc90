/*
 * hwfs_api.h — the public API (include/hwfs.h) beside the internal vocabulary
 * (hwfs_common.h), for the files that need both: libhwfs itself and the CLI
 * built on it.
 *
 * Both headers define a `struct hwfs_tensor`: the public one is a tensor of a
 * mapped version, the internal one a tensor of a file record (what the index
 * and the manifest hold).  Struct tags never reach the linker, so a file that
 * includes both renames the internal one, here, to hwfs_tensor_rec; such a
 * file then uses only the public one under its own name.  Include this header
 * before any other hwfs header.
 */
#ifndef HWFS_API_H
#define HWFS_API_H

#ifdef HWFS_COMMON_H
#error "hwfs_api.h must come before hwfs_common.h (and every header that includes it)"
#endif

#define hwfs_tensor hwfs_tensor_rec
#include "hwfs_common.h"
#include "ctl.h"
#undef hwfs_tensor

/* libhwfs is built with -fvisibility=hidden: the API it declares is what it exports */
#pragma GCC visibility push(default)
#include "hwfs.h"
#pragma GCC visibility pop

#endif /* HWFS_API_H */
