/*
 * hwfs_api.h — the public API (include/hwfs.h) beside the internal vocabulary
 * (hwfs_common.h), for the files that need both: libhwfs itself and the CLI
 * built on it.
 *
 * Include it instead of hwfs.h inside the project: it marks the public API
 * as exported (libhwfs is built with -fvisibility=hidden).
 */
#ifndef HWFS_API_H
#define HWFS_API_H

#include "hwfs_common.h"
#include "ctl.h"

/* libhwfs is built with -fvisibility=hidden: the API it declares is what it exports */
#pragma GCC visibility push(default)
#include "hwfs.h"
#pragma GCC visibility pop

#endif /* HWFS_API_H */
